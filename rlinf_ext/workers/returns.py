"""What the agent-loop and reward workers return to the driver, typed: one value per rank of a group call. They
travel through Ray, so they hold plain values (picklable dataclasses, lists, dicts, floats); the metric names inside
``metrics`` are ``protocol/metric_keys.py``'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlinf_ext.protocol import metric_keys as mk


@dataclass
class AgentLoopOutput:
    """One agent-loop rank's return of ``run_agentloop_rollout``: the rollout of its share of one request."""

    trajectories: list[dict]  # one record per trajectory (uid, index, prompt_ids, response_ids, ...): the step dump
    metrics: dict[str, float]  # agent/... means over this rank's trajectories
    num_trajectories: int
    tool_calls: int  # over every tool
    tool_time: float  # seconds the tools took for this request's trajectories (not those of other batches)
    wall_time: float  # seconds from taking the request to the last group's end

    @staticmethod
    def merged(outs: Sequence[AgentLoopOutput]) -> AgentLoopOutput:
        """One return for several requests of the same rank (a dynamic-sampling step's batches): trajectories
        concatenated, counts and times summed, metrics trajectory-weighted."""
        total = sum(out.num_trajectories for out in outs)
        keys = set().union(*(out.metrics.keys() for out in outs))
        return AgentLoopOutput(
            trajectories=[rec for out in outs for rec in out.trajectories],
            metrics={
                k: sum(out.metrics.get(k, 0.0) * out.num_trajectories for out in outs) / max(total, 1) for k in keys
            },
            num_trajectories=total,
            tool_calls=sum(out.tool_calls for out in outs),
            tool_time=sum(out.tool_time for out in outs),
            wall_time=sum(out.wall_time for out in outs),
        )


@dataclass
class FinishedGroup:
    """What the agent loop puts on the Rollout queue for each group it finishes under ``runner.admission: group``:
    the group's result (what the reward worker scores) and its own share of the request's return, so a step that
    admits groups of several requests reports exactly the groups it trains."""

    result: Any  # the group's AgentRolloutResult
    output: AgentLoopOutput  # this group alone; wall_time: from taking the request to this group's end


@dataclass
class RewardOutput:
    """The reward worker's return of ``compute_rewards``: the true rewards (also under the shuffled control) and
    the reward/... metrics of the groups it scored."""

    rewards: dict[str, list[float]]  # group uid -> one reward per trajectory, by index
    metrics: dict[str, float]

    @staticmethod
    def merged(outs: Sequence[RewardOutput]) -> RewardOutput:
        """One return for several batches: every uid's rewards; ``reward/max`` and ``reward/min`` over all, every
        other metric a mean weighted by the batch's trajectories (exact for the reward worker's own means; an
        agent's per-category means are weighted by all trajectories, not by the category's)."""
        weights = [sum(len(v) for v in out.rewards.values()) for out in outs]
        metrics = {}
        for key in set().union(*(out.metrics.keys() for out in outs)):
            values = [(out.metrics[key], w) for out, w in zip(outs, weights) if key in out.metrics]
            if key == mk.REWARD_MAX:
                metrics[key] = max(v for v, _ in values)
            elif key == mk.REWARD_MIN:
                metrics[key] = min(v for v, _ in values)
            else:
                metrics[key] = sum(v * w for v, w in values) / max(sum(w for _, w in values), 1)
        return RewardOutput(rewards={uid: r for out in outs for uid, r in out.rewards.items()}, metrics=metrics)


def scored_trajectories(outs: Sequence[AgentLoopOutput], reward: RewardOutput, step: int) -> list[dict]:
    """Every rank's trajectory records, each given its reward and the step that trained it (the step dump)."""
    records = [rec for out in outs for rec in out.trajectories]
    for rec in records:
        rec["reward"] = reward.rewards[rec["uid"]][rec["index"]]
        rec["step"] = step
    return records
