"""The order in which GRPOTrainer starts and waits on worker calls, with fake worker groups (no Ray):
CPU and disaggregated GPU runs keep the overlapped order; collocated GPU runs take turns on the GPU as
RLinf's AgentRunner does when not pipelined (rollout init before actor init; whole rollout, rollout
offload, actor onload, then reward/log-probs/training, actor offload). A weight sync is skipped when the
engine already holds the actor's current weights (validation synced them and nothing dropped them since)."""

from __future__ import annotations

from types import SimpleNamespace

from group_fakes import SYNC, FuncResult, c, check_group_call, w

from rlinf_ext.protocol.channels import KeyedChannel
from rlinf_ext.runner.groups import Placement, WorkerGroups
from rlinf_ext.runner.pipeline import BatchPipeline
from rlinf_ext.runner.step_metrics import EngineCounters
from rlinf_ext.runner.trainer import GRPOTrainer
from rlinf_ext.sync.weight_sync import SyncRoutes
from rlinf_ext.workers.returns import AgentLoopOutput, RewardOutput
from tests.support.signature_checks import checked_against

REPLIES = {
    "agent_loop.run_agentloop_rollout": [
        AgentLoopOutput(
            trajectories=[{"uid": "u", "index": 0, "prompt_ids": [1, 2], "response_ids": [3]}],
            metrics={"agent/turns": 1.0},
            num_trajectories=1,
            tool_calls=0,
            tool_time=0.0,
            wall_time=0.0,
        )
    ],
    "reward.compute_rewards": [RewardOutput(rewards={"u": [1.0]}, metrics={"reward/mean": 1.0})],
    "actor.run_training": [({"reward_scores": 1.0}, [{"loss": 0.5, "lr": 1e-6}])],
}


class _Handle(FuncResult):
    """RLinf's result of a group call (tests/runner/group_fakes.py), logging its wait."""

    def __init__(self, log: list, name: str):
        super().__init__(REPLIES.get(name, [None]), on_wait=lambda: log.append(("wait", name)))
        self.name = name


class _Group:
    """A worker group: each call is checked against the component's worker classes, then logged."""

    def __init__(self, component: str, log: list):
        self.component, self.log = component, log

    def __getattr__(self, method: str):
        name = f"{self.component}.{method}"

        def call(*args, **kwargs):
            check_group_call(self.component, method, *args, **kwargs)
            self.log.append(("call", name))
            return _Handle(self.log, name)

        return call


class _Channel:
    """The trainer's step channel (a ``KeyedChannel`` view of RLinf's channel)."""

    @checked_against(KeyedChannel.put)
    def put(self, item, weight=0, key=None, async_op=False):
        pass

    @checked_against(KeyedChannel.sub)
    def sub(self, key):
        return self

    @checked_against(KeyedChannel.get)
    def get(self, key=None, async_op=False):  # a dynamic step reads its scored groups back: one mixed group
        return SimpleNamespace(uid="u", rewards=[0.0, 1.0])


class _Validation:
    def run(self, step: int) -> dict:
        return {"val/n": 1.0}

    def summary(self, metrics: dict) -> str:
        return "1 question"


# the placements: (GPUs per node, cluster.component_placement)
CLUSTERS = {
    "cpu": (0, {"actor,rollout,reward": "all"}),
    "collocated": (2, {"actor,rollout,reward": "all"}),
    "disaggregated": (2, {"actor,reward": "0", "rollout": "1"}),
}


def _trainer(placement: str, validate_every: int = -1, adv_type: str = "grpo") -> tuple[GRPOTrainer, list]:
    log: list = []
    routes = SyncRoutes("broadcast" if placement == "disaggregated" else "paired", 1, 1)
    gpus_per_node, component_placement = CLUSTERS[placement]
    groups = WorkerGroups(
        **{c: _Group(c, log) for c in ("rollout", "actor", "reward", "agent_loop")},
        placement=Placement(rollout_dp_size=1, agent_loop_world_size=1, actor_world_size=1, weight_sync=routes),
    )
    trainer = GRPOTrainer.__new__(GRPOTrainer)  # no Ray: only what init_workers/train_step read
    trainer.cfg = SimpleNamespace(
        runner=SimpleNamespace(
            resume_dir=None,
            seed=0,
            admission="batch",
            sync_every=1,
            val_before_train=validate_every > 0,
            val_check_interval=validate_every,
        ),
        data=SimpleNamespace(val_data_paths=["val.jsonl"] if validate_every > 0 else [], rollout_batch_size=1),
        algorithm=SimpleNamespace(group_size=1, kl_beta=0.0, adv_type=adv_type, max_num_gen_batches=1, n_minibatches=1),
        cluster=SimpleNamespace(num_nodes=1, num_gpus_per_node=gpus_per_node, component_placement=component_placement),
    )
    trainer.groups, trainer.verify_sync, trainer.global_step = groups, True, 0
    trainer.channels = {
        n: _Channel() for n in ("DataLoader", "GenerateInput", "GenerateOutput", "Rollout", "Reward", "Inference")
    }
    trainer._serving, trainer.resume_dir = None, None
    trainer._validation = _Validation() if validate_every > 0 else None
    trainer._rollout_current, trainer.val_history = False, {}
    trainer.pipeline = BatchPipeline(trainer.cfg, groups, trainer.channels, max_staleness=0)
    return trainer, log


def _run(placement: str, adv_type: str = "grpo") -> tuple[list, list]:
    trainer, log = _trainer(placement, adv_type=adv_type)
    trainer.init_workers()
    init = list(log)
    log.clear()
    metrics, trajectories = trainer.train_step([{"prompt_ids": [1, 2], "answers": ["a"], "uid": "q"}])
    assert trainer.global_step == 1 and trajectories[0]["reward"] == 1.0 and metrics["actor/loss"] == 0.5
    return init, list(log)


SET_ROUTES = [
    c("actor.set_weight_sync"),
    w("actor.set_weight_sync"),
    c("rollout.set_weight_sync"),
    w("rollout.set_weight_sync"),
]
OVERLAPPED_INIT = [
    c("rollout.init_worker"),
    c("reward.init_worker"),
    c("agent_loop.init_worker"),
    c("actor.init_worker"),
    w("rollout.init_worker"),
    w("reward.init_worker"),
    w("agent_loop.init_worker"),
    w("actor.init_worker"),
    *SET_ROUTES,
    c("rollout.rollout_serverless"),
]
OVERLAPPED_STEP = SYNC + [
    c("agent_loop.run_agentloop_rollout"),
    c("reward.compute_rewards"),
    c("actor.run_inference"),
    c("actor.run_training"),
    w("agent_loop.run_agentloop_rollout"),
    w("reward.compute_rewards"),
    w("actor.run_inference"),
    w("actor.run_training"),
    c("rollout.offload_engine"),
    w("rollout.offload_engine"),
]


def test_cpu_and_disaggregated_order_is_unchanged():
    for placement in ("cpu", "disaggregated"):
        init, step = _run(placement)
        assert init == OVERLAPPED_INIT and step == OVERLAPPED_STEP, placement


def test_collocated_gpu_takes_turns_on_the_gpu():
    init, step = _run("collocated")
    assert init == [
        c("rollout.init_worker"),
        c("reward.init_worker"),
        c("agent_loop.init_worker"),
        w("rollout.init_worker"),  # the engine has released its memory before the actor builds its model
        c("actor.init_worker"),
        w("reward.init_worker"),
        w("agent_loop.init_worker"),
        w("actor.init_worker"),
        *SET_ROUTES,
        c("actor.offload_engine"),
        w("actor.offload_engine"),  # the rollout gets the GPU first
        c("rollout.rollout_serverless"),
    ]
    assert step == SYNC + [
        c("agent_loop.run_agentloop_rollout"),
        w("agent_loop.run_agentloop_rollout"),
        c("rollout.offload_engine"),
        w("rollout.offload_engine"),
        c("actor.onload_engine"),
        w("actor.onload_engine"),
        c("reward.compute_rewards"),
        c("actor.run_inference"),
        c("actor.run_training"),
        w("reward.compute_rewards"),
        w("actor.run_inference"),
        w("actor.run_training"),
        c("actor.offload_engine"),
        w("actor.offload_engine"),
    ]


def test_a_collocated_dynamic_step_scores_its_groups_before_the_engine_gives_the_gpu_back():
    """grpo_dynamic: a refill needs the engine, so the rewards are waited for while the rollout holds the GPU; the
    actor then takes the selected groups as in a GRPO step."""
    _, step = _run("collocated", adv_type="grpo_dynamic")
    assert step == SYNC + [
        c("agent_loop.run_agentloop_rollout"),
        c("reward.compute_rewards"),
        w("agent_loop.run_agentloop_rollout"),
        w("reward.compute_rewards"),
        c("rollout.offload_engine"),
        w("rollout.offload_engine"),
        c("actor.onload_engine"),
        w("actor.onload_engine"),
        c("actor.run_inference"),
        c("actor.run_training"),
        w("actor.run_inference"),
        w("actor.run_training"),
        c("actor.offload_engine"),
        w("actor.offload_engine"),
    ]


def test_a_group_call_a_worker_would_refuse_is_refused():
    import pytest

    with pytest.raises(TypeError, match="HFRolloutWorker.offload_engine.*too many positional"):
        check_group_call("rollout", "offload_engine", 1)
    with pytest.raises(AttributeError, match="HFRolloutWorker has no method sync_weights"):
        check_group_call("rollout", "sync_weights")


def _syncs(log: list) -> int:
    return log.count(c("rollout.sync_model_from_actor"))


def test_validation_sync_is_not_repeated_by_the_next_step():
    """Validation after step N syncs the updated weights; step N+1 starts with the same weights and must not
    sync them again, whatever the placement. After the update, the next validation syncs anew."""
    item = [{"prompt_ids": [1, 2], "answers": ["a"], "uid": "q"}]
    for placement in CLUSTERS:
        trainer, log = _trainer(placement, validate_every=1)
        trainer.init_workers()
        log.clear()
        trainer.validate(0)
        assert _syncs(log) == 1
        trainer.train_step(item)  # same weights as validation 0: no second sync
        assert _syncs(log) == 1, placement
        trainer.validate(1)  # the update changed them
        assert _syncs(log) == 2
        log.clear()
        trainer.train_step(item)
        assert _syncs(log) == 0
        trainer.validate(2)  # step 2's update changed them again
        assert _syncs(log) == 1


def test_without_validation_every_step_syncs():
    trainer, log = _trainer("collocated")
    trainer.init_workers()
    item = [{"prompt_ids": [1, 2], "answers": ["a"], "uid": "q"}]
    for _ in range(2):
        trainer.train_step(item)
    assert _syncs(log) == 2


def test_engine_mismatch_rate_and_probe_gap_are_logged_per_step(monkeypatch):
    """vLLM/SGLang with images: after the rollout the trainer reads the rollout ranks' cumulative re-tokenisation
    counts and logs the step's share (validation's prompts are read and dropped), and the probe gap of the sync."""
    from rlinf_ext.protocol import metric_keys as mk

    states = iter(
        [
            [{mk.RETOKENIZE_COUNTS: (0, 4)}, {mk.RETOKENIZE_COUNTS: (1, 4)}],  # validation 0: 8 prompts, dropped
            [
                {mk.RETOKENIZE_COUNTS: (1, 6), "last_sync_logprob_gap": 2e-7},  # step 1: 1 of 4 new prompts
                {mk.RETOKENIZE_COUNTS: (1, 6), "last_sync_logprob_gap": 5e-7},
            ],
            [
                {mk.RETOKENIZE_COUNTS: (1, 9), "last_sync_logprob_gap": 3e-7},  # step 2: 0 of 6, synced
                {mk.RETOKENIZE_COUNTS: (1, 9), "last_sync_logprob_gap": 1e-7},
            ],
        ]
    )
    plain_wait = _Handle.wait

    def wait(self):  # each read of the rollout state gets the next states of the two ranks
        return next(states) if plain_wait(self) and self.name == "rollout.get_state" else REPLIES.get(self.name, [None])

    monkeypatch.setattr(_Handle, "wait", wait)
    trainer, log = _trainer("cpu", validate_every=1)
    trainer.engine_counters = EngineCounters(trainer.groups.rollout)
    trainer.init_workers()
    trainer.validate(0)
    item = [{"prompt_ids": [1, 2], "answers": ["a"], "uid": "q"}]
    first, _ = trainer.train_step(item)  # no sync: validation 0 synced these weights
    assert first[mk.RETOKENIZE_MISMATCH] == 0.25 and mk.SYNC_LOGPROB_GAP not in first
    trainer._rollout_current = False
    second, _ = trainer.train_step(item)
    assert second[mk.RETOKENIZE_MISMATCH] == 0.0 and second[mk.SYNC_LOGPROB_GAP] == 3e-7
    assert log.count(c("rollout.get_state")) == 3


def test_engine_state_is_read_for_engines_that_expand_images(monkeypatch):
    from rlinf_ext.config import load_config
    from rlinf_ext.runner.step_metrics import engine_counts_mismatches

    assert engine_counts_mismatches(load_config("tiny-mm-cpu", ["rollout.rollout_backend=vllm"]))
    for key in ("RLINF_EXT_QWEN25_VL_7B", "RLINF_EXT_FVQA_DATA", "RLINF_EXT_RETRIEVER_ADDR"):
        monkeypatch.setenv(key, "/x")
    assert engine_counts_mismatches(
        load_config("qwen2.5-vl-7b-1node", ["rollout.rollout_backend=sglang"], strict=False)
    )
    assert not engine_counts_mismatches(load_config("tiny-mm-cpu", ["rollout.rollout_backend=hf"]))
    assert not engine_counts_mismatches(load_config("tiny-cpu"))
