"""Compose RLinf worker groups for a Search-R1 run (docs/contracts.md §7).

On a CPU cluster every group is placed with ``NodePlacementStrategy`` (RLinf's packed strategies refuse
nodes without accelerators): the HF rollout engine, the Megatron-core actor (one process per placed rank =
data-parallel size, e.g. ``actor: 0-1`` = DP 2), the reward worker and the agent-loop workers. On a GPU
cluster ``gpu_groups.launch_gpu_groups`` places the SGLang rollout (``rlinf_ext.engines.gpu_rollout``) and
the actor (one data-parallel process per actor GPU) with RLinf's placement (not GPU-verified).
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from typing import Any

COMPONENTS = ("rollout", "actor", "reward", "agent_loop")


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

    is_pipeline: bool
    rollout_dp_size: int
    agent_loop_world_size: int
    actor_world_size: int
    on_gpu: bool


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
        import ray

        try:
            ray.get(handle._remote_results)
        except Exception as exc:  # the remote exception, re-raised with the component named
            cause = getattr(exc, "cause", None) or exc
            if startup:
                raise WorkerStartupError(component, cause) from exc
            raise WorkerCallError(component, method, cause) from exc
    return results


def quiet_worker_failures() -> None:
    """Replace RLinf's SIGUSR1 handler (which exits the driver when any remote call fails) with a no-op.

    Failures then surface as exceptions where the runner waits (``wait_or_raise``), so the launcher can
    report them, stop the other workers and shut Ray down cleanly. Only possible from the main thread.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)


def _process_counts(cfg: Any) -> dict[str, int]:
    """Processes per component on a CPU cluster: ``cluster.component_placement`` ranks are worker processes
    on node 0 (``"0"`` = one process, ``"0-1"`` = two; rlinf_ext.config.placement's reading)."""
    from rlinf_ext.config.placement import parse_ranks, split_components

    counts = {"rollout": 1, "actor": 1, "reward": 1}
    placement = cfg.cluster.component_placement
    for key in placement:
        n = len(parse_ranks(placement[key], None))
        for comp in split_components(key):
            if comp in counts:
                counts[comp] = n
    return counts


def check_actor_data_parallel(cfg: Any, actor_processes: int) -> None:
    """Refuse, before anything starts, a batch the actor's data-parallel ranks cannot share: every rank trains
    on whole GRPO groups (``data.rollout_batch_size`` results per step), TP=PP=1 per process."""
    from rlinf_ext.engines.data_parallel import DataParallel, DataParallelError, share_of

    tp, pp = int(cfg.actor.model.tensor_model_parallel_size), int(cfg.actor.model.pipeline_model_parallel_size)
    if (tp, pp) != (1, 1):
        raise WorkerStartupError(
            "actor", f"actor.model.tensor_model_parallel_size={tp}, pipeline_model_parallel_size={pp}: the "
            "Megatron-core actor runs TP=PP=1 per process (data parallelism only). Fix: set both to 1.")
    try:
        share_of(int(cfg.data.rollout_batch_size), DataParallel(size=actor_processes))
    except DataParallelError as exc:
        raise WorkerStartupError("actor", exc) from exc


def cpu_strategy(n: int):
    """``n`` processes on node 0, no accelerator."""
    from rlinf.scheduler.placement import NodePlacementStrategy

    return NodePlacementStrategy([0] * n)


def launch_group(groups: dict[str, Any], cluster: Any, component: str, cls, name: str, strategy, *args, **kwargs) -> None:
    """``cls.create_group(*args, **kwargs).launch(...)`` into ``groups[component]``; failures name the component."""
    try:
        groups[component] = cls.create_group(*args, **kwargs).launch(cluster, placement_strategy=strategy, name=name)
    except Exception as exc:
        raise WorkerStartupError(component, exc) from exc


def launch_worker_groups(
    cfg: Any,
    cluster: Any,
    *,
    total_train_steps: int = 1,
    deterministic_rollout: bool = False,
    verify_sync: bool = True,
    search_server_addr: Any = None,
) -> WorkerGroups:
    """Launch the rollout, actor, reward and agent-loop groups (not yet initialised: see the trainer)."""
    quiet_worker_failures()
    if int(getattr(cluster, "num_accelerators", 0) or 0) > 0:
        from rlinf_ext.runner.gpu_groups import launch_gpu_groups

        return launch_gpu_groups(cfg, cluster, total_train_steps=total_train_steps, verify_sync=verify_sync,
                                 search_server_addr=search_server_addr)
    counts = _process_counts(cfg)
    check_actor_data_parallel(cfg, counts["actor"])
    from rlinf_ext.engines.actor_worker import MegatronActorWorker
    from rlinf_ext.engines.agent_loop_worker import SearchR1AgentLoopWorker
    from rlinf_ext.engines.reward_worker import SearchR1RewardWorker
    from rlinf_ext.engines.rollout_worker import HFRolloutWorker

    if cfg.rollout.rollout_backend != "hf":
        raise WorkerStartupError(
            "rollout", f"rollout.rollout_backend={cfg.rollout.rollout_backend!r} needs GPUs; on CPU set rollout.rollout_backend=hf"
        )
    groups: dict[str, Any] = {}
    n_rollout = counts["rollout"]
    launch_group(groups, cluster, "rollout", HFRolloutWorker, cfg.rollout.group_name, cpu_strategy(n_rollout), cfg,
                 deterministic=deterministic_rollout, verify_sync=verify_sync)
    launch_group(groups, cluster, "actor", MegatronActorWorker, cfg.actor.group_name, cpu_strategy(counts["actor"]),
                 cfg, total_train_steps)
    launch_group(groups, cluster, "reward", SearchR1RewardWorker, cfg.reward.group_name, cpu_strategy(1), cfg)
    launch_group(groups, cluster, "agent_loop", SearchR1AgentLoopWorker, cfg.agentloop.group_name,
                 cpu_strategy(n_rollout), cfg, search_server_addr=search_server_addr)
    placement = Placement(
        is_pipeline=False,
        rollout_dp_size=counts["rollout"],
        agent_loop_world_size=counts["rollout"],
        actor_world_size=counts["actor"],
        on_gpu=False,
    )
    return WorkerGroups(placement=placement, **groups)


def rollout_generator(groups: WorkerGroups, input_channel=None, output_channel=None):
    """A contract-§2 ``Generator`` backed by the running rollout group (evaluation, probes).

    Pass the generate channels the rollout group serves (``SearchR1Trainer.generate_channels``).
    """
    from rlinf_ext.engines.agent_loop_worker import ChannelGenerator

    if input_channel is None or output_channel is None:
        raise ValueError("rollout_generator needs the GenerateInput/GenerateOutput channels the rollout group serves.")
    return ChannelGenerator(input_channel, output_channel)


def stop_worker_groups(groups: WorkerGroups) -> None:
    """Kill every worker process of the groups (the Ray cluster itself stays up)."""
    import ray

    for component in COMPONENTS:
        group = getattr(groups, component, None)
        for rank in getattr(group, "_workers", []) or []:
            try:
                ray.kill(rank.worker, no_restart=True)
            except Exception:  # already gone
                pass
