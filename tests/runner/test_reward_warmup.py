"""The search-penalty warm-up through the trainer -> reward-worker seam (no Ray): the runner hands the step it is
training to ``RewardWorker.compute_rewards``, so ``agentloop.mmsearch.reward.search_penalty_warmup_steps`` ramps the
penalty over the steps instead of scoring every step as step 0.

The trainer is GRPOTrainer itself (bare, without Ray); the reward group runs the real ``RewardWorker.compute_rewards``
on in-memory channels; the agent loop puts the same MMSearch-R1 group every step: one correct answer after an
image search (penalised) and one correct direct answer (never penalised)."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest
from group_fakes import FuncResult, check_group_call

from rlinf_ext.agent.mmsearch.config import MMSearchConfig, RewardShapingConfig
from rlinf_ext.agent.mmsearch.rollout import group_result
from rlinf_ext.agent.mmsearch.types import VLTrajectory, VLTurnRecord
from rlinf_ext.config.schema import RewardConfig
from rlinf_ext.protocol.channels import KeyedChannel
from rlinf_ext.protocol.images import ImageRef
from rlinf_ext.runner.groups import Placement, WorkerGroups
from rlinf_ext.runner.pipeline import BatchPipeline
from rlinf_ext.runner.trainer import GRPOTrainer
from rlinf_ext.sync.weight_sync import SyncRoutes
from rlinf_ext.workers.returns import AgentLoopOutput
from rlinf_ext.workers.reward import RewardWorker
from tests.support.signature_checks import checked_against

SEARCH = "<reason> look it up </reason><search><img></search>"
ANSWER = "<reason> it is red </reason><answer> red </answer>"
IMG = ImageRef("ab" * 20, b"png", 56, 56)


def _traj(turn_texts: list[str], image_searches: int) -> VLTrajectory:
    turns = [
        VLTurnRecord(prompt_ids=[1], response_ids=[2], observation_ids=[], text=t, action="answer") for t in turn_texts
    ]
    return VLTrajectory(
        uid="u",
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        response_mask=[1, 1],
        turns=turns,
        response_text="".join(turn_texts),
        answers=["red"],
        images=[IMG] * (1 + image_searches),
        category="search_free",
        metrics={
            "image_searches": float(image_searches),
            "text_searches": 0.0,
            "image_search_failures": 0.0,
            "text_search_failures": 0.0,
        },
    )


class _Queue:
    """A step channel (a ``KeyedChannel`` view of RLinf's channel: its put/get checked), in memory."""

    def __init__(self):
        self.q = queue.Queue()

    @checked_against(KeyedChannel.put)
    def put(self, item, weight=0, key=None, async_op=False) -> None:
        self.q.put(item)

    @checked_against(KeyedChannel.get)
    def get(self, key=None, async_op=False):
        return self.q.get_nowait()

    @checked_against(KeyedChannel.sub)
    def sub(self, key):
        return self.__dict__.setdefault(f"sub/{key}", _Queue())


def _Done(value) -> FuncResult:
    return FuncResult([value])


class _AgentLoop:
    def run_agentloop_rollout(self, *args, **kwargs):
        check_group_call("agent_loop", "run_agentloop_rollout", *args, **kwargs)
        input_channel, output_channel = args
        input_channel.get()  # the step's request
        output_channel.put(group_result([_traj([SEARCH, ANSWER], 1), _traj([ANSWER], 0)], "prompt"))
        records = [{"uid": "u", "index": i, "prompt_ids": [1, 2], "response_ids": [3, 4]} for i in range(2)]
        return _Done(
            AgentLoopOutput(
                trajectories=records, metrics={}, num_trajectories=2, tool_calls=0, tool_time=0.0, wall_time=0.0
            )
        )


class _Reward:
    """The reward group: the real worker method, called in-process."""

    def __init__(self, reward_cfg: RewardConfig, warmup_steps: int):
        self.worker = RewardWorker.__new__(RewardWorker)  # no Ray actor; only what compute_rewards reads
        section = MMSearchConfig(reward=RewardShapingConfig(search_penalty_warmup_steps=warmup_steps))
        self.worker.cfg = SimpleNamespace(
            reward=reward_cfg, agentloop=SimpleNamespace(agent="mmsearch", mmsearch=section)
        )
        self.worker._timer_metrics = {}
        self.worker.init_worker()  # the agent's reward and reward metrics

    def compute_rewards(self, *args, **kwargs):
        return _Done(self.worker.compute_rewards(*args, **kwargs))


class _Actor:
    """The actor or rollout group: each call checked against the component's worker classes."""

    def __init__(self, component: str):
        self.component = component

    def __getattr__(self, method):
        reply = ({"reward_scores": 0.0}, [{"loss": 0.0, "lr": 0.0}]) if method == "run_training" else None

        def call(*args, **kwargs):
            check_group_call(self.component, method, *args, **kwargs)
            return _Done(reply)

        return call


def _trainer(reward_cfg: RewardConfig, warmup_steps: int) -> GRPOTrainer:
    groups = WorkerGroups(
        rollout=_Actor("rollout"),
        actor=_Actor("actor"),
        reward=_Reward(reward_cfg, warmup_steps),
        agent_loop=_AgentLoop(),
        placement=Placement(
            rollout_dp_size=1, agent_loop_world_size=1, actor_world_size=1, weight_sync=SyncRoutes("paired", 1, 1)
        ),
    )
    trainer = GRPOTrainer.__new__(GRPOTrainer)  # no Ray: only what train_step reads
    trainer.cfg = SimpleNamespace(
        runner=SimpleNamespace(seed=0, admission="batch", sync_every=1),
        algorithm=SimpleNamespace(group_size=2, kl_beta=0.0, adv_type="grpo"),
        cluster=SimpleNamespace(num_nodes=1, num_gpus_per_node=0, component_placement={"actor,rollout,reward": "all"}),
    )
    trainer.groups, trainer.verify_sync, trainer.global_step, trainer._rollout_current = groups, False, 0, True
    trainer.channels = {name: _Queue() for name in ("DataLoader", "Rollout", "Reward", "Inference")}
    trainer.pipeline = BatchPipeline(trainer.cfg, groups, trainer.channels, max_staleness=0)
    return trainer


def _rewards_per_step(reward_cfg: RewardConfig, steps: int, warmup_steps: int = 0) -> list[list[float]]:
    trainer = _trainer(reward_cfg, warmup_steps)
    out = []
    for _ in range(steps):
        _, trajectories = trainer.train_step([{"prompt_ids": [1, 2], "answers": ["red"], "uid": "q"}])
        out.append([t["reward"] for t in sorted(trajectories, key=lambda t: t["index"])])
    return out


def test_search_penalty_ramps_over_the_training_steps():
    """warm-up 2, penalty 0.1 (``penalty_at``: -0.1 at step 0, 0 at step 1, +0.1 from step 2): the searching
    trajectory scores 1.1, 1.0, 0.9, 0.9; the direct answer 1.0 throughout. Scoring every step as step 0 (the old
    seam) gave 1.1 forever."""
    cfg = RewardConfig(scoring="em", search_penalty=0.1)
    rewards = _rewards_per_step(cfg, 4, warmup_steps=2)
    assert [r[0] for r in rewards] == pytest.approx([1.1, 1.0, 0.9, 0.9])
    assert [r[1] for r in rewards] == pytest.approx([1.0] * 4)


def test_without_warmup_the_penalty_holds_from_the_first_step():
    cfg = RewardConfig(scoring="em", search_penalty=0.1)
    assert [r[0] for r in _rewards_per_step(cfg, 2)] == pytest.approx([0.9, 0.9])
