"""The Search-R1 multi-turn rollout as a pure async function of a generator, a tokenizer and a search tool.

Each turn generates with the engine's own stop strings (`</search>`, `</answer>`, EOS), so the ids kept are
exactly the ids sampled. A search appends an `<information>` observation, an invalid turn appends
Search-R1's invalid-action message; both are environment text with loss mask 0.

Ids, mask and log-probs accumulate in the shared ``agent/core/response.py`` buffer (its invariant is checked on
every trajectory).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlinf_ext.agent.searchr1.protocol import parse_action, with_required_stops
from rlinf_ext.agent.core.config import AgentLoopConfig, check_agent_config
from rlinf_ext.agent.core.response import ResponseBuffer, check_mask_invariant
from rlinf_ext.agent.core.types import Trajectory, TurnRecord
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.generation import GenerationResult, Generator, SamplingParams
from rlinf_ext.tools.formatting import (
    Observation,
    build_invalid_action_observation,
    build_observation,
    format_documents,
    search_failed_text,
)


@dataclass
class _Rollout(ResponseBuffer):
    """What one trajectory has accumulated so far (ids, mask, turns, counters)."""

    budget: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict(
        searches=0, search_failures=0, invalid_actions=0, generated_tokens=0, truncated_observations=0))
    search_latency: float = 0.0
    end_reason: str = ""

    def append(self, context: list[int], result: GenerationResult, action: str, content: str | None,
               observation: Observation | None, search_ok: bool | None) -> None:
        """Add one turn: the sampled ids (mask 1), then the observation (mask 0) if a token still fits after it."""
        sampled = list(result.output_ids)
        self.add_sampled(sampled, result.logprobs)
        observation_ids: list[int] = []
        if observation is not None:
            # An observation is useful only if at least one token can be generated after it.
            if len(self.response_ids) + len(observation.ids) >= self.budget:
                self.end_reason = "response_budget"
            else:
                observation_ids = observation.ids
                self.add_observation(observation_ids)
        self.turns.append(TurnRecord(
            prompt_ids=context, response_ids=sampled, observation_ids=observation_ids, text=result.text,
            action=action, finish_reason=result.finish_reason, matched_stop=result.matched_stop,
            query=content if action in ("search", "search_disabled") else None, search_ok=search_ok,
            logprobs=None if result.logprobs is None else list(result.logprobs),
            generated_tokens=result.generated_tokens,
        ))


def _end_before_turn(cfg: AgentLoopConfig, turn_index: int, remaining: int) -> str:
    """Why no further turn is generated ("" = generate one): the turn limit, or no token budget left."""
    max_turns = int(cfg.max_turns)
    if turn_index >= max_turns and (not cfg.force_final_answer or turn_index > max_turns):
        return "max_turns"
    return "response_budget" if remaining <= 0 else ""


async def _act(action: str, content: str | None, final_turn: bool, cfg: AgentLoopConfig, tokenizer: Any, search_tool: Any,
               state: _Rollout) -> tuple[str, Observation | None, bool | None]:
    """Carry out a parsed action: ``(action as recorded, observation to append or None, search ok?)``.

    Sets ``state.end_reason`` when the action ends the trajectory (answer, EOS, a search or an invalid turn in
    the final turn)."""
    if action == "search" and final_turn:
        state.end_reason = "max_turns"
        return "search_disabled", None, None
    if action == "search":
        state.counts["searches"] += 1
        found = await search_tool.search(content)
        state.search_latency += found.latency_s
        if found.ok:
            body = format_documents(found.documents, cfg.observation_format)
        else:
            state.counts["search_failures"] += 1
            body = search_failed_text(found.error)
        observation = build_observation(tokenizer, body, int(cfg.max_obs_length))
        state.counts["truncated_observations"] += int(observation.truncated)
        return action, observation, found.ok
    if action == "invalid" and final_turn:
        state.end_reason = "no_answer_after_final_turn"
        return action, None, None
    if action == "invalid":
        state.counts["invalid_actions"] += 1
        return action, build_invalid_action_observation(tokenizer), None
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
        end_reason=state.end_reason,
    )
    trajectory.metrics = {
        "turns": float(len(state.turns)),
        **{name: float(value) for name, value in state.counts.items()},
        **state.length_metrics(),
        "search_latency_s": state.search_latency,
    }
    check_mask_invariant(trajectory)
    return trajectory


async def run_trajectory(
    generator: Generator,
    tokenizer: Any,
    prompt_ids: list[int],
    answers: Any,
    cfg: AgentLoopConfig,
    search_tool: Any,
    *,
    sampling_params: SamplingParams | None = None,
    uid: str | None = None,
    reward_fn: Callable[[Trajectory], float] | None = None,
) -> Trajectory:
    """Roll out one trajectory. `cfg` is the `agentloop` section; `search_tool` has `async search(query)`."""
    check_agent_config(cfg)
    base = sampling_params or SamplingParams()
    stops = with_required_stops(base.stop)
    state = _Rollout(budget=int(cfg.response_length_total))
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
        action, content = parse_action(result.text, result.finish_reason)
        final_turn = turn_index >= int(cfg.max_turns)  # search is disabled in this turn
        action, observation, search_ok = await _act(action, content, final_turn, cfg, tokenizer, search_tool, state)
        state.append(context, result, action, content, observation, search_ok)
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
    cfg: AgentLoopConfig,
    search_tool: Any,
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
                    generator, tokenizer, prompt_ids, answers, cfg, search_tool,
                    sampling_params=sampling_params, uid=uid, reward_fn=reward_fn,
                )
                for _ in range(group_size)
            )
        )
    )


METRIC_KEYS = ("turns", "searches", "search_failures", "invalid_actions", "generated_tokens", "kept_tokens",
               "observation_tokens", "response_length", "truncated_observations")


def summarize_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Means over trajectories under `agent/<name>` (``protocol/metric_keys.py``)."""
    if not trajectories:
        return {}
    n = len(trajectories)
    summary = {mk.agent_metric(key): sum(t.metrics[key] for t in trajectories) / n for key in METRIC_KEYS}
    summary[mk.AGENT_SEARCH_FAILURE_RATE] = (
        sum(t.metrics["search_failures"] for t in trajectories)
        / max(1.0, sum(t.metrics["searches"] for t in trajectories))
    )
    return summary
