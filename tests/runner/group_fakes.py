"""Stand-ins for RLinf's worker groups in the trainer tests (no Ray), checked against the real classes.

A call ``groups.<component>.<method>(*args, **kwargs)`` is RLinf's dispatch: every rank runs the worker class's own
``method(*args, **kwargs)``. ``check_group_call`` binds it to that method of each worker class the component can
be (the rollout: every engine's worker), so a trainer calling a method a worker lacks, or with arguments it
refuses, fails here as it would under Ray. ``FuncResult`` stands for what the call returns, RLinf's
``WorkerGroupFuncResult`` (its methods spelled and checked as RLinf's, tests/support/signature_checks.py).
"""

from __future__ import annotations

import functools
from typing import Any

from rlinf.scheduler import WorkerGroupFuncResult

from tests.support.signature_checks import bind_like, checked_against


@functools.cache
def worker_classes() -> dict[str, tuple[type, ...]]:
    from rlinf_ext.workers.actor import ActorWorker
    from rlinf_ext.workers.agent_loop import AgentLoopWorker
    from rlinf_ext.workers.reward import RewardWorker
    from rlinf_ext.workers.rollout_hf import HFRolloutWorker
    from rlinf_ext.workers.rollout_sglang import SGLangRolloutWorker
    from rlinf_ext.workers.rollout_vllm import VLLMRolloutWorker

    return {
        "actor": (ActorWorker,),
        "reward": (RewardWorker,),
        "agent_loop": (AgentLoopWorker,),
        "rollout": (HFRolloutWorker, VLLMRolloutWorker, SGLangRolloutWorker),
    }


def check_group_call(component: str, method: str, *args: Any, **kwargs: Any) -> None:
    """``method(*args, **kwargs)`` as each worker class of ``component`` takes it (``self`` bound to None)."""
    for cls in worker_classes()[component]:
        real = getattr(cls, method, None)
        if real is None or not callable(real):
            raise AttributeError(f"{cls.__name__} has no method {method}: the {component} group cannot run it")
        bind_like(real, None, *args, label=f"{cls.__name__}.{method}", **kwargs)


class FuncResult:
    """RLinf's ``WorkerGroupFuncResult`` of a finished call: ``wait()`` gives one value per rank."""

    _remote_results: list = []  # no Ray object refs: wait_all_or_raise falls through to wait()

    def __init__(self, values: list, on_wait=None):
        self.values, self.on_wait = values, on_wait

    @checked_against(WorkerGroupFuncResult.wait)
    def wait(self):
        if self.on_wait is not None:
            self.on_wait()
        return self.values

    @checked_against(WorkerGroupFuncResult.done)
    def done(self):
        return True

    @checked_against(WorkerGroupFuncResult.consume_duration)
    def consume_duration(self, reduction_type="max"):
        return 0.0


# the order of group calls a trainer makes, as the tests' call logs record it
def c(name):
    return ("call", name)


def w(name):
    return ("wait", name)


SYNC = [
    c("actor.sync_model_to_rollout"),
    c("rollout.sync_model_from_actor"),
    w("actor.sync_model_to_rollout"),
    w("rollout.sync_model_from_actor"),
]
