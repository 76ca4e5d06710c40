"""Compose the RLinf worker groups of a Search-R1 run: the CPU composition here, GPU clusters dispatched to
``runner/gpu_groups.py``.

On a CPU cluster every group is placed with ``NodePlacementStrategy`` (RLinf's packed strategies refuse nodes
without accelerators): the HF rollout engine, the Megatron-core actor (one process per placed rank = data-parallel
size, e.g. ``actor: 0-1`` = DP 2), the reward worker and the agent-loop workers. On a GPU cluster
``gpu_groups.launch_gpu_groups`` places the SGLang rollout and the actor (one data-parallel process per actor GPU)
with RLinf's placement (not GPU-verified).
"""

from __future__ import annotations

from typing import Any

from rlinf_ext.config.placement import component_ranks
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.runner.gpu_groups import launch_gpu_groups
from rlinf_ext.runner.groups import (
    Placement,
    WorkerGroups,
    WorkerStartupError,
    check_actor_data_parallel,
    cpu_process_counts,
    cpu_strategy,
    launch_group,
    quiet_worker_failures,
)
from rlinf_ext.workers.actor import MegatronActorWorker
from rlinf_ext.workers.agent_loop import SearchR1AgentLoopWorker
from rlinf_ext.workers.reward import SearchR1RewardWorker
from rlinf_ext.workers.rollout_hf import HFRolloutWorker
from rlinf_ext.workers.weight_sync import SyncRoutes, sync_mode


def launch_worker_groups(
    cfg: ExperimentConfig,
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
        return launch_gpu_groups(cfg, cluster, total_train_steps=total_train_steps, verify_sync=verify_sync,
                                 search_server_addr=search_server_addr)
    counts = cpu_process_counts(cfg)
    check_actor_data_parallel(cfg, counts["actor"])
    if cfg.rollout.rollout_backend != "hf":
        raise WorkerStartupError(
            "rollout", f"rollout.rollout_backend={cfg.rollout.rollout_backend!r} needs GPUs; "
            "on CPU set rollout.rollout_backend=hf")
    groups: dict[str, Any] = {}
    n_rollout = counts["rollout"]
    launch_group(groups, cluster, "rollout", HFRolloutWorker, cfg.rollout.group_name, cpu_strategy(n_rollout), cfg,
                 deterministic=deterministic_rollout, verify_sync=verify_sync)
    launch_group(groups, cluster, "actor", MegatronActorWorker, cfg.actor.group_name, cpu_strategy(counts["actor"]),
                 cfg, total_train_steps)
    launch_group(groups, cluster, "reward", SearchR1RewardWorker, cfg.reward.group_name, cpu_strategy(1), cfg)
    launch_group(groups, cluster, "agent_loop", SearchR1AgentLoopWorker, cfg.agentloop.group_name,
                 cpu_strategy(n_rollout), cfg, search_server_addr=search_server_addr)
    ranks = component_ranks(cfg.cluster.component_placement, None)
    placement = Placement(
        is_pipeline=False,
        rollout_dp_size=counts["rollout"],
        agent_loop_world_size=counts["rollout"],
        actor_world_size=counts["actor"],
        on_gpu=False,
        # same process indices = the CPU stand-in of collocated GPUs: shared-memory handles, rank to rank
        weight_sync=SyncRoutes(sync_mode(ranks.get("actor", [0]), ranks.get("rollout", [0])),
                               counts["actor"], counts["rollout"]),
    )
    return WorkerGroups(placement=placement, **groups)
