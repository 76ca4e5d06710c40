"""The order in which SearchR1Trainer starts and waits on worker calls, with fake worker groups (no Ray):
CPU and disaggregated GPU runs keep the overlapped order; collocated GPU runs take turns on the GPU as
RLinf's AgentRunner does when not pipelined (rollout init before actor init; whole rollout, rollout
offload, actor onload, then reward/log-probs/training, actor offload)."""

from __future__ import annotations

from types import SimpleNamespace

from rlinf_ext.runner.groups import Placement, WorkerGroups
from rlinf_ext.runner.trainer import SearchR1Trainer

REPLIES = {
    "agent_loop.run_agentloop_rollout": [{
        "trajectories": [{"uid": "u", "index": 0, "prompt_ids": [1, 2], "response_ids": [3]}],
        "metrics": {"agent/turns": 1.0}, "num_trajectories": 1, "tool_time": 0.0,
    }],
    "reward.compute_rewards": [{"rewards": {"u": [1.0]}, "metrics": {"reward/mean": 1.0}}],
    "actor.run_training": [({"reward_scores": 1.0}, [{"loss": 0.5, "lr": 1e-6}])],
}


class _Handle:
    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def wait(self):
        self.log.append(("wait", self.name))
        return REPLIES.get(self.name, [None])

    def done(self) -> bool:
        return True

    def consume_duration(self) -> float:
        return 0.0


class _Group:
    def __init__(self, component: str, log: list):
        self.component, self.log = component, log

    def __getattr__(self, method: str):
        name = f"{self.component}.{method}"

        def call(*args, **kwargs):
            self.log.append(("call", name))
            return _Handle(self.log, name)

        return call


class _Channel:
    def put(self, item) -> None:
        pass


def _trainer(on_gpu: bool, is_pipeline: bool) -> tuple[SearchR1Trainer, list]:
    log: list = []
    groups = WorkerGroups(
        **{c: _Group(c, log) for c in ("rollout", "actor", "reward", "agent_loop")},
        placement=Placement(is_pipeline=is_pipeline, rollout_dp_size=1, agent_loop_world_size=1,
                            actor_world_size=1, on_gpu=on_gpu),
    )
    trainer = SearchR1Trainer.__new__(SearchR1Trainer)  # no Ray: only what init_workers/train_step read
    trainer.cfg = SimpleNamespace(
        runner=SimpleNamespace(resume_dir=None, seed=0, val_before_train=False, val_check_interval=-1),
        data=SimpleNamespace(val_data_paths=[]),
        algorithm=SimpleNamespace(group_size=1, kl_beta=0.0),
    )
    trainer.groups, trainer.verify_sync, trainer.global_step = groups, True, 0
    trainer.channels = {n: _Channel() for n in ("DataLoader", "GenerateInput", "GenerateOutput", "Rollout",
                                                "Reward", "Inference")}
    trainer._serving, trainer._validation, trainer.resume_dir = None, None, None
    return trainer, log


def _run(on_gpu: bool, is_pipeline: bool) -> tuple[list, list]:
    trainer, log = _trainer(on_gpu, is_pipeline)
    trainer.init_workers()
    init = list(log)
    log.clear()
    metrics, trajectories = trainer.train_step([{"prompt_ids": [1, 2], "answers": ["a"], "uid": "q"}])
    assert trainer.global_step == 1 and trajectories[0]["reward"] == 1.0 and metrics["actor/loss"] == 0.5
    return init, list(log)


def c(name):
    return ("call", name)


def w(name):
    return ("wait", name)


SYNC = [c("actor.sync_model_to_rollout"), c("rollout.sync_model_from_actor"), w("rollout.sync_model_from_actor"),
        c("actor.del_reshard_state_dict"), w("actor.del_reshard_state_dict")]
OVERLAPPED_INIT = [
    c("rollout.init_worker"), c("reward.init_worker"), c("agent_loop.init_worker"), c("actor.init_worker"),
    w("rollout.init_worker"), w("reward.init_worker"), w("agent_loop.init_worker"), w("actor.init_worker"),
    c("actor.set_rollout_world_size"), w("actor.set_rollout_world_size"), c("rollout.rollout_serverless"),
]
OVERLAPPED_STEP = SYNC + [
    c("agent_loop.run_agentloop_rollout"), c("reward.compute_rewards"), c("actor.run_inference"),
    c("actor.run_training"), w("agent_loop.run_agentloop_rollout"), w("reward.compute_rewards"),
    w("actor.run_inference"), w("actor.run_training"), c("rollout.offload_engine"), w("rollout.offload_engine"),
]


def test_cpu_and_disaggregated_order_is_unchanged():
    for on_gpu, is_pipeline in ((False, False), (True, True)):
        init, step = _run(on_gpu, is_pipeline)
        assert init == OVERLAPPED_INIT and step == OVERLAPPED_STEP, (on_gpu, is_pipeline)


def test_collocated_gpu_takes_turns_on_the_gpu():
    init, step = _run(on_gpu=True, is_pipeline=False)
    assert init == [
        c("rollout.init_worker"), c("reward.init_worker"), c("agent_loop.init_worker"),
        w("rollout.init_worker"),  # the engine has released its memory before the actor builds its model
        c("actor.init_worker"),
        w("reward.init_worker"), w("agent_loop.init_worker"), w("actor.init_worker"),
        c("actor.set_rollout_world_size"), w("actor.set_rollout_world_size"),
        c("actor.offload_engine"), w("actor.offload_engine"),  # the rollout gets the GPU first
        c("rollout.rollout_serverless"),
    ]
    assert step == SYNC + [
        c("agent_loop.run_agentloop_rollout"), w("agent_loop.run_agentloop_rollout"),
        c("rollout.offload_engine"), w("rollout.offload_engine"),
        c("actor.onload_engine"), w("actor.onload_engine"),
        c("reward.compute_rewards"), c("actor.run_inference"), c("actor.run_training"),
        w("reward.compute_rewards"), w("actor.run_inference"), w("actor.run_training"),
        c("actor.offload_engine"), w("actor.offload_engine"),
    ]
