"""The Search-R1 multi-turn rollout as a pure async function of a generator, a tokenizer and a search tool.

Each turn generates with the engine's own stop strings (`</search>`, `</answer>`, EOS), so the ids kept are
exactly the ids sampled. A search appends an `<information>` observation, an invalid turn appends
Search-R1's invalid-action message; both are environment text with loss mask 0.

INVARIANT (checked by `check_mask_invariant` on every trajectory): `response_ids` is the concatenation over
turns of (sampled ids, observation ids), and `response_mask` is 1 on exactly the sampled ids and 0 on
exactly the observation ids.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from rlinf_ext.agent.actions import parse_action, with_required_stops
from rlinf_ext.agent.config import check_agent_config
from rlinf_ext.agent.types import Generator, SamplingParams, Trajectory, TurnRecord
from rlinf_ext.tools.formatting import (
    Observation,
    build_invalid_action_observation,
    build_observation,
    format_documents,
    search_failed_text,
)


def check_mask_invariant(trajectory: Trajectory) -> None:
    """Raise AssertionError unless ids and mask are exactly the turns' sampled (1) and observation (0) ids."""
    expected_ids: list[int] = []
    expected_mask: list[int] = []
    for turn in trajectory.turns:
        expected_ids += turn.response_ids + turn.observation_ids
        expected_mask += [1] * len(turn.response_ids) + [0] * len(turn.observation_ids)
    if trajectory.response_ids != expected_ids or trajectory.response_mask != expected_mask:
        raise AssertionError(
            "loss-mask invariant broken: response ids/mask differ from the turns' sampled+observation ids"
        )


async def run_trajectory(
    generator: Generator,
    tokenizer: Any,
    prompt_ids: list[int],
    answers: Any,
    cfg: Any,
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
    max_turns, budget = int(cfg.max_turns), int(cfg.response_length_total)

    response_ids: list[int] = []
    response_mask: list[int] = []
    logprobs: list[float] | None = []
    turns: list[TurnRecord] = []
    counts = dict(searches=0, search_failures=0, invalid_actions=0, generated_tokens=0, truncated_observations=0)
    search_latency = 0.0
    end_reason = ""

    turn_index = 0
    while True:
        final_turn = turn_index >= max_turns  # search is disabled in this turn
        if final_turn and (not cfg.force_final_answer or turn_index > max_turns):
            end_reason = "max_turns"
            break
        remaining = budget - len(response_ids)
        if remaining <= 0:
            end_reason = "response_budget"
            break
        params = base.with_updates(max_new_tokens=min(base.max_new_tokens, remaining), stop=stops)
        context = list(prompt_ids) + response_ids
        result = await generator.generate(context, params)
        sampled = list(result.output_ids)
        if len(sampled) > params.max_new_tokens:
            raise RuntimeError(
                f"generator returned {len(sampled)} ids for max_new_tokens={params.max_new_tokens}; "
                "it must honour the per-call budget"
            )
        counts["generated_tokens"] += result.generated_tokens
        action, content = parse_action(result.text, result.finish_reason)

        observation: Observation | None = None
        search_ok = None
        if action == "search" and final_turn:
            action, end_reason = "search_disabled", "max_turns"
        elif action == "search":
            counts["searches"] += 1
            found = await search_tool.search(content)
            search_latency += found.latency_s
            search_ok = found.ok
            if found.ok:
                body = format_documents(found.documents, cfg.observation_format)
            else:
                counts["search_failures"] += 1
                body = search_failed_text(found.error)
            observation = build_observation(tokenizer, body, int(cfg.max_obs_length))
            counts["truncated_observations"] += int(observation.truncated)
        elif action == "invalid" and final_turn:
            end_reason = "no_answer_after_final_turn"
        elif action == "invalid":
            counts["invalid_actions"] += 1
            observation = build_invalid_action_observation(tokenizer)
        else:
            end_reason = action  # answer | eos

        response_ids += sampled
        response_mask += [1] * len(sampled)
        if logprobs is not None and result.logprobs is not None and len(result.logprobs) == len(sampled):
            logprobs += list(result.logprobs)
        else:
            logprobs = None

        observation_ids: list[int] = []
        if observation is not None:
            # An observation is useful only if at least one token can be generated after it.
            if len(response_ids) + len(observation.ids) >= budget:
                end_reason = "response_budget"
            else:
                observation_ids = observation.ids
                response_ids += observation_ids
                response_mask += [0] * len(observation_ids)
                if logprobs is not None:
                    logprobs += [0.0] * len(observation_ids)
        turns.append(
            TurnRecord(
                prompt_ids=context,
                response_ids=sampled,
                observation_ids=observation_ids,
                text=result.text,
                action=action,
                finish_reason=result.finish_reason,
                matched_stop=result.matched_stop,
                query=content if action in ("search", "search_disabled") else None,
                search_ok=search_ok,
                logprobs=None if result.logprobs is None else list(result.logprobs),
                generated_tokens=result.generated_tokens,
            )
        )
        turn_index += 1
        if end_reason:
            break

    trajectory = Trajectory(
        uid=uid or uuid.uuid4().hex,
        prompt_ids=list(prompt_ids),
        response_ids=response_ids,
        response_mask=response_mask,
        turns=turns,
        response_text=tokenizer.decode(response_ids),
        answers=answers,
        rollout_logprobs=logprobs,
        end_reason=end_reason,
    )
    kept = sum(response_mask)
    trajectory.metrics = {
        "turns": float(len(turns)),
        **{name: float(value) for name, value in counts.items()},
        "kept_tokens": float(kept),
        "observation_tokens": float(len(response_ids) - kept),
        "response_length": float(len(response_ids)),
        "search_latency_s": search_latency,
    }
    check_mask_invariant(trajectory)
    if reward_fn is not None:
        trajectory.reward = float(reward_fn(trajectory))
    if cfg.print_outputs:
        print(f"[agent uid={trajectory.uid} end={end_reason}] {trajectory.response_text}", flush=True)
    return trajectory


async def run_group(
    generator: Generator,
    tokenizer: Any,
    prompt_ids: list[int],
    answers: Any,
    cfg: Any,
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
    """Means over trajectories under `agent/<name>` (the trainer's metric names, docs/contracts.md §7)."""
    if not trajectories:
        return {}
    n = len(trajectories)
    summary = {f"agent/{key}": sum(t.metrics[key] for t in trajectories) / n for key in METRIC_KEYS}
    summary["agent/search_failure_rate"] = (
        sum(t.metrics["search_failures"] for t in trajectories)
        / max(1.0, sum(t.metrics["searches"] for t in trajectories))
    )
    return summary
