"""The Search-R1 multi-turn rollout as a pure async function of a generator, a tokenizer and a list of tools.

Each turn generates with the engine's own stop strings (every tool's closing tag, `</answer>`, EOS), so the ids
kept are exactly the ids sampled. A tool call appends the tool's output as an `<information>` observation, an
invalid turn appends the invalid-action message built from the tools; both are environment text with loss mask 0.
A turn that ends on EOS with no action is, under ``on_no_action: retry`` (Search-R1's rule), an invalid turn kept
without its EOS id; under ``end`` it ends the trajectory. The final turn ends it either way.
Everything tool-specific comes from the tools (``tools/base.py``) through the turn protocol (``protocol.py``).

Ids, mask and log-probs accumulate in the shared ``agent/core/response.py`` buffer (its invariant is checked on
every trajectory).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rlinf_ext.agent.core.response import ResponseBuffer, check_mask_invariant
from rlinf_ext.agent.core.types import EOS, INVALID, TOOL_DISABLED, Trajectory, TurnRecord
from rlinf_ext.agent.searchr1.config import RETRY, LoopSettings
from rlinf_ext.agent.searchr1.protocol import TurnProtocol
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.generation import GenerationResult, Generator, SamplingParams
from rlinf_ext.tools.base import Tool
from rlinf_ext.tools.formatting import (
    Observation,
    build_invalid_action_observation,
    build_observation,
)

# loop counters (Trajectory.metrics) beside each tool's own (Tool.metric_names)
LOOP_COUNTERS = ("invalid_actions", "generated_tokens", "truncated_observations")


@dataclass
class _Call:
    """A tool call as the turn record keeps it."""

    tool: str
    content: str | None
    ok: bool | None = None


@dataclass
class _Rollout(ResponseBuffer):
    """What one trajectory has accumulated so far (ids, mask, turns, counters)."""

    budget: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    counts: dict[str, float] = field(default_factory=dict)
    end_reason: str = ""

    def append(
        self,
        context: list[int],
        result: GenerationResult,
        action: str,
        call: _Call | None,
        observation: Observation | None,
    ) -> None:
        """Add one turn: the sampled ids (mask 1), then the observation (mask 0) if a token still fits after it."""
        sampled = list(result.output_ids)
        self.add_sampled(sampled, result.logprobs, result.weight_version)
        observation_ids: list[int] = []
        if observation is not None:
            # An observation is useful only if at least one token can be generated after it.
            if len(self.response_ids) + len(observation.ids) >= self.budget:
                self.end_reason = "response_budget"
            else:
                observation_ids = observation.ids
                self.add_observation(observation_ids)
        self.turns.append(
            TurnRecord(
                prompt_ids=context,
                response_ids=sampled,
                observation_ids=observation_ids,
                text=result.text,
                action=action,
                finish_reason=result.finish_reason,
                matched_stop=result.matched_stop,
                tool=call.tool if call else None,
                query=call.content if call else None,
                tool_ok=call.ok if call else None,
                logprobs=None if result.logprobs is None else list(result.logprobs),
                generated_tokens=result.generated_tokens,
                weight_version=result.weight_version,
            )
        )


def _without_eos(result: GenerationResult, tokenizer: Any) -> GenerationResult:
    """The turn without its final EOS id, for ``on_no_action: retry``. Search-R1 decodes each turn with
    ``skip_special_tokens`` and re-tokenises it, so the turn that follows never sees an EOS in its context; keeping it
    would ask the model to go on after its own end-of-turn, a context it never met (the engine's count of generated
    tokens stays as it was)."""
    ids = list(result.output_ids[:-1])
    version = result.weight_version
    return replace(
        result,
        output_ids=ids,
        text=tokenizer.decode(ids),
        num_generated=result.generated_tokens,
        logprobs=None if result.logprobs is None else list(result.logprobs[:-1]),
        weight_version=version[:-1] if isinstance(version, list) else version,
    )


def _end_before_turn(cfg: LoopSettings, turn_index: int, remaining: int) -> str:
    """Why no further turn is generated ("" = generate one): the turn limit, or no token budget left."""
    max_turns = int(cfg.max_turns)
    if turn_index >= max_turns and (not cfg.force_final_answer or turn_index > max_turns):
        return "max_turns"
    return "response_budget" if remaining <= 0 else ""


def initial_counts(tools: Sequence[Tool]) -> dict[str, float]:
    """Every counter a trajectory reports, at zero: the loop's and each tool's calls, failures and latency."""
    counts = {name: 0.0 for name in LOOP_COUNTERS}
    for tool in tools:
        names = tool.metric_names()
        counts.update({names.calls: 0.0, names.failures: 0.0, names.latency_s: 0.0})
    return counts


async def _act(
    action: str,
    content: str | None,
    final_turn: bool,
    cfg: LoopSettings,
    tokenizer: Any,
    tools: dict[str, Tool],
    protocol: TurnProtocol,
    state: _Rollout,
) -> tuple[str, Observation | None, _Call | None]:
    """Carry out a parsed action: ``(action as recorded, observation to append or None, the tool call or None)``.

    Sets ``state.end_reason`` when the action ends the trajectory (answer, EOS, a tool call or an invalid turn in
    the final turn)."""
    tool = tools.get(action)
    if tool is not None and final_turn:  # the final turn may only answer
        state.end_reason = "max_turns"
        return TOOL_DISABLED, None, _Call(action, content)
    if tool is not None:
        names = tool.metric_names()
        output = await tool.run(content or "")
        state.counts[names.calls] += 1
        state.counts[names.failures] += 0 if output.ok else 1
        state.counts[names.latency_s] += float(output.latency_s or 0.0)
        observation = build_observation(tokenizer, output.body, int(cfg.max_obs_length))
        state.counts["truncated_observations"] += int(observation.truncated)
        return action, observation, _Call(action, content, output.ok)
    if action == INVALID and final_turn:
        state.end_reason = "no_answer_after_final_turn"
        return action, None, None
    if action == INVALID:
        state.counts["invalid_actions"] += 1
        return action, build_invalid_action_observation(tokenizer, protocol.invalid_action_message), None
    state.end_reason = action  # answer | eos
    return action, None, None


def _finish(state: _Rollout, uid: str | None, prompt_ids: list[int], answers: Any, tokenizer: Any) -> Trajectory:
    """The ``Trajectory`` with its metrics, checked against the mask invariant."""
    trajectory = Trajectory(
        uid=uid or uuid.uuid4().hex,
        prompt_ids=list(prompt_ids),
        response_ids=state.response_ids,
        response_mask=state.response_mask,
        turns=state.turns,
        response_text=tokenizer.decode(state.response_ids),
        answers=answers,
        rollout_logprobs=state.logprobs,
        rollout_versions=state.versions,
        end_reason=state.end_reason,
    )
    trajectory.metrics = {
        "turns": float(len(state.turns)),
        **{name: float(value) for name, value in state.counts.items()},
        **state.length_metrics(),
    }
    check_mask_invariant(trajectory)
    return trajectory


async def run_trajectory(
    generator: Generator,
    tokenizer: Any,
    prompt_ids: list[int],
    answers: Any,
    cfg: LoopSettings,
    tools: Sequence[Tool],
    *,
    sampling_params: SamplingParams | None = None,
    uid: str | None = None,
    reward_fn: Callable[[Trajectory], float] | None = None,
) -> Trajectory:
    """Roll out one trajectory. `cfg` holds the loop's settings (``LoopSettings.from_config``); `tools` are built
    tools (``tools/registry.py:build_tools``)."""
    tools = list(tools)
    protocol = TurnProtocol.of(tools)
    by_name = {tool.name: tool for tool in tools}
    base = sampling_params or SamplingParams()
    stops = protocol.with_required_stops(base.stop)
    state = _Rollout(budget=int(cfg.response_length_total), counts=initial_counts(tools))
    turn_index = 0
    while not state.end_reason:
        remaining = state.budget - len(state.response_ids)
        state.end_reason = _end_before_turn(cfg, turn_index, remaining)
        if state.end_reason:
            break
        params = base.with_updates(max_new_tokens=min(base.max_new_tokens, remaining), stop=stops)
        context = list(prompt_ids) + state.response_ids
        result = await generator.generate(context, params)
        if len(result.output_ids) > params.max_new_tokens:
            raise RuntimeError(
                f"generator returned {len(result.output_ids)} ids for max_new_tokens={params.max_new_tokens}; "
                "it must honour the per-call budget"
            )
        state.counts["generated_tokens"] += result.generated_tokens
        action, content = protocol.parse(result.text, result.finish_reason)
        final_turn = turn_index >= int(cfg.max_turns)  # tool calls are disabled in this turn
        if action == EOS and cfg.on_no_action == RETRY and not final_turn:
            action, result = INVALID, _without_eos(result, tokenizer)
        action, observation, call = await _act(action, content, final_turn, cfg, tokenizer, by_name, protocol, state)
        state.append(context, result, action, call, observation)
        turn_index += 1
    trajectory = _finish(state, uid, prompt_ids, answers, tokenizer)
    if reward_fn is not None:
        trajectory.reward = float(reward_fn(trajectory))
    if cfg.print_outputs:
        print(f"[agent uid={trajectory.uid} end={trajectory.end_reason}] {trajectory.response_text}", flush=True)
    return trajectory


async def run_group(
    generator: Generator,
    tokenizer: Any,
    prompt_ids: list[int],
    answers: Any,
    cfg: LoopSettings,
    tools: Sequence[Tool],
    group_size: int,
    *,
    sampling_params: SamplingParams | None = None,
    uid: str | None = None,
    reward_fn: Callable[[Trajectory], float] | None = None,
) -> list[Trajectory]:
    """`group_size` trajectories of one prompt, run concurrently, sharing one uid (the GRPO group id)."""
    if group_size < 1:
        raise ValueError(f"algorithm.group_size must be >= 1, got {group_size}")
    uid = uid or uuid.uuid4().hex
    return list(
        await asyncio.gather(
            *(
                run_trajectory(
                    generator,
                    tokenizer,
                    prompt_ids,
                    answers,
                    cfg,
                    tools,
                    sampling_params=sampling_params,
                    uid=uid,
                    reward_fn=reward_fn,
                )
                for _ in range(group_size)
            )
        )
    )


def summarize_metrics(trajectories: list[Trajectory], tools: Sequence[Tool] = ()) -> dict[str, float]:
    """Means over trajectories of every counter they report, under `agent/<name>` (``protocol/metric_keys.py``),
    and each tool's failure rate over the step (the search tool's: `agent/search_failure_rate`)."""
    if not trajectories:
        return {}
    n = len(trajectories)
    keys = list(dict.fromkeys(key for t in trajectories for key in t.metrics))
    summary = {mk.agent_metric(key): sum(t.metrics.get(key, 0.0) for t in trajectories) / n for key in keys}
    for tool in tools:
        names = tool.metric_names()
        calls = sum(t.metrics.get(names.calls, 0.0) for t in trajectories)
        failures = sum(t.metrics.get(names.failures, 0.0) for t in trajectories)
        summary[mk.agent_metric(names.failure_rate)] = failures / max(1.0, calls)
    return summary
