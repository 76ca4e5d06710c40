"""The typed worker returns (workers/returns.py), hand-computed: several batches' returns merged into one per rank
(a dynamic-sampling step), the rewards given to the trajectory records, and a round trip through pickle (what Ray
does to them)."""

from __future__ import annotations

import pickle

import pytest

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.workers.returns import AgentLoopOutput, RewardOutput, scored_trajectories


def agent_out(n: int, turns: float, wall: float, tool: float, tag: str) -> AgentLoopOutput:
    return AgentLoopOutput(
        trajectories=[{"uid": f"{tag}{i}"} for i in range(n)],
        metrics={"agent/turns": turns},
        num_trajectories=n,
        tool_calls=n,
        tool_time=tool,
        wall_time=wall,
    )


def test_merged_agent_outputs_sum_times_and_weight_metrics_by_trajectories():
    first = [agent_out(4, 2.0, 3.0, 1.0, "a"), agent_out(2, 1.0, 2.0, 0.5, "b")]
    second = [agent_out(2, 5.0, 4.0, 2.0, "c"), agent_out(2, 4.0, 1.0, 0.0, "d")]
    rank0, rank1 = (AgentLoopOutput.merged(rank) for rank in zip(first, second))
    assert [t["uid"] for t in rank0.trajectories] == ["a0", "a1", "a2", "a3", "c0", "c1"]
    assert (rank0.num_trajectories, rank0.wall_time, rank0.tool_time, rank0.tool_calls) == (6, 7.0, 3.0, 6)
    assert rank0.metrics["agent/turns"] == pytest.approx((4 * 2.0 + 2 * 5.0) / 6)
    assert rank1.metrics["agent/turns"] == pytest.approx(2.5) and rank1.wall_time == 3.0


def test_merged_reward_outputs_are_the_means_over_every_trajectory():
    one = RewardOutput(
        rewards={"a": [0.0, 0.0], "b": [0.0, 1.0]},
        metrics={mk.REWARD_MEAN: 0.25, mk.REWARD_MAX: 1.0, mk.REWARD_MIN: 0.0, mk.REWARD_MIXED_GROUPS: 0.5},
    )
    two = RewardOutput(
        rewards={"c": [1.0, 1.0], "d": [1.0, 1.0], "e": [1.0, 1.0], "f": [1.0, 1.0]},
        metrics={mk.REWARD_MEAN: 1.0, mk.REWARD_MAX: 1.0, mk.REWARD_MIN: 1.0, mk.REWARD_MIXED_GROUPS: 0.0},
    )
    merged = RewardOutput.merged([one, two])
    assert merged.rewards == {**one.rewards, **two.rewards}
    assert merged.metrics == {
        mk.REWARD_MEAN: pytest.approx(9 / 12),
        mk.REWARD_MAX: 1.0,
        mk.REWARD_MIN: 0.0,
        mk.REWARD_MIXED_GROUPS: pytest.approx(1 / 6),
    }


def test_each_record_gets_its_own_reward_and_the_step():
    outs = [
        AgentLoopOutput(
            trajectories=[{"uid": "a", "index": 1}, {"uid": "b", "index": 0}],
            metrics={},
            num_trajectories=2,
            tool_calls=0,
            tool_time=0.0,
            wall_time=0.0,
        )
    ]
    records = scored_trajectories(outs, RewardOutput(rewards={"a": [0.0, 0.5], "b": [1.0]}, metrics={}), step=3)
    assert records == [
        {"uid": "a", "index": 1, "reward": 0.5, "step": 3},
        {"uid": "b", "index": 0, "reward": 1.0, "step": 3},
    ]


def test_the_returns_survive_pickling():
    out, reward = agent_out(2, 1.0, 2.0, 0.5, "a"), RewardOutput(rewards={"a0": [1.0]}, metrics={mk.REWARD_MEAN: 1.0})
    assert pickle.loads(pickle.dumps(out)) == out and pickle.loads(pickle.dumps(reward)) == reward
