"""``reward.shuffle_within_step`` (the shuffled-reward control): the real ``RewardWorker.compute_rewards`` on
in-memory channels with Search-R1 groups; the actor gets the step's rewards permuted across all its groups, the
``reward/*`` metrics and the returned rewards stay the true ones."""

from __future__ import annotations

import queue
from types import SimpleNamespace

from rlinf_ext.config.schema import RewardConfig
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.payloads import AgentRolloutResult
from rlinf_ext.rewards.searchr1 import searchr1_reward
from rlinf_ext.workers.reward import RewardWorker, mixed_group_share, shuffled_rewards


class _Queue:
    def __init__(self, items=()):
        self.q = queue.Queue()
        for item in items:
            self.q.put(item)

    def put(self, item, weight=0, key=None, async_op=False):
        self.q.put(item)

    def get(self, key=None, async_op=False):
        return self.q.get_nowait()


def _group(uid: str, texts: list[str]) -> AgentRolloutResult:
    n = len(texts)
    return AgentRolloutResult(
        num_sequence=n,
        group_size=n,
        prompt_lengths=[1] * n,
        prompt_ids=[[1]] * n,
        response_lengths=[1] * n,
        response_ids=[[2]] * n,
        is_end=[True] * n,
        answers=[["Trestias"]] * n,
        generated_texts=texts,
        num_searches=[1] * n,
        uid=uid,
    )


RIGHT, WRONG = "<answer> Trestias </answer>", "<answer> Brelok </answer>"


def _run(shuffle: bool, step: int = 3):
    worker = RewardWorker.__new__(RewardWorker)  # no Ray actor: only what compute_rewards reads
    worker.cfg = SimpleNamespace(
        reward=RewardConfig(scoring="em", shuffle_within_step=shuffle),
        data=SimpleNamespace(seed=7),
        agentloop=SimpleNamespace(agent="searchr1"),
        tools=None,
    )
    worker._timer_metrics = {}
    worker.reward_fn = searchr1_reward
    worker.reward_metrics, worker.tool_tags = None, None
    groups = [_group("a", [RIGHT, RIGHT, RIGHT, WRONG]), _group("b", [WRONG, WRONG, WRONG, WRONG])]
    out = _Queue()
    reply = worker.compute_rewards(_Queue(groups), out, len(groups), step)
    given = [out.get() for _ in groups]
    return reply, [g.rewards.tolist() for g in given]


def test_without_the_switch_each_group_keeps_its_rewards():
    reply, given = _run(shuffle=False)
    assert given == [[1.0, 1.0, 1.0, 0.0], [0.0] * 4]
    assert reply.rewards == {"a": [1.0, 1.0, 1.0, 0.0], "b": [0.0] * 4}


def test_shuffled_rewards_are_the_steps_rewards_permuted_across_groups():
    reply, given = _run(shuffle=True)
    flat = [r for g in given for r in g]
    assert flat == shuffled_rewards([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], seed=7, step=3)
    assert sorted(flat) == sorted([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # same mean and spread
    assert given != [[1.0, 1.0, 1.0, 0.0], [0.0] * 4]  # this seed moves rewards between the groups
    # what the run logs is what the policy earned
    assert reply.rewards == {"a": [1.0, 1.0, 1.0, 0.0], "b": [0.0] * 4}
    assert reply.metrics[mk.REWARD_MEAN] == 3 / 8
    assert reply.metrics[mk.REWARD_MIXED_GROUPS] == 1 / 2  # group a is mixed, b is not (true rewards)


def test_mixed_group_share():
    assert mixed_group_share([[1.0, 0.0], [0.0, 0.0], [0.5, 0.5], [0.1, 0.9, 0.9]]) == 2 / 4
    assert mixed_group_share([]) == 0.0


def test_the_permutation_follows_seed_and_step():
    rewards = [float(i) for i in range(16)]
    assert shuffled_rewards(rewards, 7, 3) == shuffled_rewards(rewards, 7, 3)
    assert shuffled_rewards(rewards, 7, 3) != shuffled_rewards(rewards, 7, 4)
    assert sorted(shuffled_rewards(rewards, 1, 0)) == rewards
