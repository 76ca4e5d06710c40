"""What every composition of RLinf worker groups shares: the groups' handle (``WorkerGroups``), the placement
facts the trainer reads, launching one group with errors that name the component, waiting on a group call with
the remote error raised, and stopping every worker.

The compositions themselves: ``runner/compose.py`` (CPU cluster, and the dispatch) and ``runner/gpu_groups.py``
(GPU cluster).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import threading
from dataclasses import dataclass
from typing import Any

import ray
from rlinf.scheduler.placement import NodePlacementStrategy

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.runner.cluster import NodeOrder
from rlinf_ext.sync.weight_sync import SyncRoutes
from rlinf_ext.training.data_parallel import DataParallel, DataParallelError, share_of, unsupported_model_parallelism


class WorkerStartupError(RuntimeError):
    """A worker group failed to start; names the component and the cause."""

    def __init__(self, component: str, cause: BaseException | str):
        self.component = component
        self.cause = cause
        super().__init__(f"{component} workers failed to start: {cause}")


class WorkerCallError(RuntimeError):
    """A call on a running worker group failed (the message carries the remote traceback's summary)."""

    def __init__(self, component: str, method: str, cause: BaseException | str):
        self.component, self.method, self.cause = component, method, cause
        super().__init__(f"{component}.{method} failed: {cause}")


@dataclass
class Placement:
    """What the runner reads from a placement (the subset of RLinf's ``ModelParallelComponentPlacement``)."""

    rollout_dp_size: int
    agent_loop_world_size: int
    actor_world_size: int
    weight_sync: SyncRoutes  # who sends the actor's weights to which rollout rank (sync/weight_sync.py)


@dataclass
class WorkerGroups:
    rollout: Any
    actor: Any
    reward: Any
    agent_loop: Any
    placement: Placement


def wait_or_raise(handle, component: str, method: str, startup: bool = False):
    """``handle.wait()`` that raises the remote error instead of returning None (see ``quiet_worker_failures``)."""
    results = handle.wait()
    if not handle.done():
        try:
            ray.get(handle._remote_results)
        except Exception as exc:  # the remote exception, re-raised with the component named
            cause = getattr(exc, "cause", None) or exc
            if startup:
                raise WorkerStartupError(component, cause) from exc
            raise WorkerCallError(component, method, cause) from exc
    return results


def abort_call(handle, component: str, method: str, timeout_s: float) -> BaseException | None:
    """End a group call whose result will be thrown away: cancel it (on an async actor Ray cancels its asyncio task,
    so a rollout stops at the turn in progress) and wait for it at most ``timeout_s``. Returns how it ended (the
    cancellation or another error, a ``TimeoutError`` when it outlived the bound, None when it had finished) and
    never raises: a discarded call's failure must not turn a clean stop into an error."""
    refs = list(handle._remote_results)
    for ref in refs:
        ray.cancel(ref)
    if refs:
        _, late = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if late:
            return TimeoutError(f"{component}.{method} still ran {timeout_s:g} s after it was cancelled")
    try:
        wait_or_raise(handle, component, method)
    except Exception as exc:  # the cancellation itself, or the call's own failure
        return exc
    return None


def is_cancellation(error: BaseException) -> bool:
    """Whether a call ended because it was cancelled (``abort_call``), as Ray reports it to the driver."""
    cause = getattr(error, "cause", None) or error
    return isinstance(cause, (ray.exceptions.TaskCancelledError, asyncio.CancelledError))


def wait_all_or_raise(calls: list[tuple[Any, str, str]]) -> list:
    """Wait for group calls that wait on each other (a sender and its receiver): the first one to fail is raised
    at once, naming its component, instead of waiting forever for the partner it left behind.
    ``calls``: ``(handle, component, method)``; returns each call's results."""
    pending = {ref: (component, method) for handle, component, method in calls for ref in handle._remote_results}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            component, method = pending.pop(ref)
            try:
                ray.get(ref)
            except Exception as exc:  # the remote exception, re-raised with the component named
                raise WorkerCallError(component, method, getattr(exc, "cause", None) or exc) from exc
    return [wait_or_raise(handle, component, method) for handle, component, method in calls]


def quiet_worker_failures() -> None:
    """Replace RLinf's SIGUSR1 handler (which exits the driver when any remote call fails) with a no-op.

    Failures then surface as exceptions where the runner waits (``wait_or_raise``), so the launcher can
    report them, stop the other workers and shut Ray down cleanly. Only possible from the main thread.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)


def check_actor_data_parallel(cfg: ExperimentConfig, actor_processes: int) -> None:
    """Refuse, before anything starts, a batch the actor's data-parallel ranks cannot share: every rank trains
    on whole GRPO groups (``data.rollout_batch_size`` results per step), TP=PP=1 per process."""
    problem = unsupported_model_parallelism(
        cfg.actor.model.tensor_model_parallel_size, cfg.actor.model.pipeline_model_parallel_size
    )
    if problem is not None:
        raise WorkerStartupError("actor", problem)
    try:
        share_of(cfg.data.rollout_batch_size, DataParallel(size=actor_processes))
    except DataParallelError as exc:
        raise WorkerStartupError("actor", exc) from exc


def cpu_strategy(n: int):
    """``n`` processes on RLinf's node 0, no accelerator."""
    return NodePlacementStrategy([0] * n)


def node_strategy(nodes: list[int], order: NodeOrder):
    """One process per entry of ``nodes`` (placement nodes, the run's stable order) on RLinf's matching node,
    no accelerator. RLinf sorts the ranks, so process ranks follow RLinf's node order; per-node counts hold."""
    return NodePlacementStrategy([order.rlinf_rank(n) for n in nodes])


def launch_group(
    groups: dict[str, Any], cluster: Any, component: str, cls, name: str, strategy, *args, **kwargs
) -> None:
    """``cls.create_group(*args, **kwargs).launch(...)`` into ``groups[component]``; failures name the component."""
    try:
        groups[component] = cls.create_group(*args, **kwargs).launch(cluster, placement_strategy=strategy, name=name)
    except Exception as exc:
        raise WorkerStartupError(component, exc) from exc


def stop_worker_groups(groups: WorkerGroups) -> None:
    """Kill every worker process of the groups (the Ray cluster itself stays up)."""
    for component in (f.name for f in dataclasses.fields(WorkerGroups) if f.name != "placement"):
        group = getattr(groups, component, None)
        for rank in getattr(group, "_workers", []) or []:
            try:
                ray.kill(rank.worker, no_restart=True)
            except Exception:  # already gone
                pass
