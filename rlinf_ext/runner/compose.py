"""Compose the RLinf worker groups of a run: the CPU composition here, GPU clusters dispatched to
``runner/gpu_groups.py``.

On a CPU cluster every group is placed with ``NodePlacementStrategy`` (RLinf's packed strategies refuse nodes
without accelerators) on the nodes ``cluster.component_placement`` names (node 0 unless ``NODES:PROCESSES``,
nodes in the run's stable order: ``runner/cluster.py``): the chosen engine's rollout worker
(``protocol/engines.py``), the Megatron-core actor (one process per placed rank = data-parallel size, e.g.
``actor: 0-1`` = DP 2), the reward worker and the agent-loop workers (one per rollout process, on the rollout's
nodes unless ``agentloop`` is placed). On a GPU cluster ``gpu_groups.launch_gpu_groups`` places the rollout and
the actor (one data-parallel process per actor GPU) with RLinf's placement (not GPU-verified).
"""

from __future__ import annotations

from typing import Any

from rlinf_ext.config.placement import PlacementError, component_ranks
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol.engines import ENGINE_KEY, ENGINES, engine_spec
from rlinf_ext.runner.cluster import NodeOrder, cpu_process_nodes
from rlinf_ext.runner.gpu_groups import launch_gpu_groups
from rlinf_ext.runner.groups import (
    Placement,
    WorkerGroups,
    WorkerStartupError,
    check_actor_data_parallel,
    launch_group,
    node_strategy,
    quiet_worker_failures,
)
from rlinf_ext.sync.weight_sync import SyncRoutes, sync_mode
from rlinf_ext.workers.actor import ActorWorker
from rlinf_ext.workers.agent_loop import AgentLoopWorker
from rlinf_ext.workers.reward import RewardWorker


def launch_worker_groups(
    cfg: ExperimentConfig,
    cluster: Any,
    *,
    total_train_steps: int = 1,
    deterministic_rollout: bool = False,
    verify_sync: bool = True,
    search_server_addr: Any = None,
    node_order: NodeOrder | None = None,
    launcher_ip: str | None = None,
) -> WorkerGroups:
    """Launch the rollout, actor, reward and agent-loop groups (not yet initialised: see the trainer).
    ``node_order``: the run's nodes (``runner/cluster.py``); None = one node. ``launcher_ip``: the launcher's
    node, where a loopback search server address points (agent loops on other nodes never use one)."""
    quiet_worker_failures()
    if int(getattr(cluster, "num_accelerators", 0) or 0) > 0:
        return launch_gpu_groups(
            cfg,
            cluster,
            total_train_steps=total_train_steps,
            verify_sync=verify_sync,
            search_server_addr=search_server_addr,
            launcher_ip=launcher_ip,
        )
    order = node_order or NodeOrder.single()
    try:
        nodes = cpu_process_nodes(cfg)
        strategies = {component: node_strategy(where, order) for component, where in nodes.items()}
    except PlacementError as exc:
        raise WorkerStartupError("cluster", exc) from exc
    check_actor_data_parallel(cfg, len(nodes["actor"]))
    engine = engine_spec(cfg)
    if not engine.runs_on(gpu=False):
        cpu = [name for name, spec in ENGINES.items() if spec.runs_on(gpu=False)]
        raise WorkerStartupError(
            "rollout", f"{ENGINE_KEY}={engine.name!r} needs GPUs; on CPU set {ENGINE_KEY} to " + " or ".join(cpu)
        )
    groups: dict[str, Any] = {}
    # an engine that seeds each request is reproducible as it is; the others serve one request at a time for it
    serial = {} if engine.seeds_each_request else {"deterministic": deterministic_rollout}
    launch_group(
        groups,
        cluster,
        "rollout",
        engine.load("rollout_worker"),
        cfg.rollout.group_name,
        strategies["rollout"],
        cfg,
        verify_sync=verify_sync,
        **serial,
    )
    launch_group(
        groups, cluster, "actor", ActorWorker, cfg.actor.group_name, strategies["actor"], cfg, total_train_steps
    )
    launch_group(groups, cluster, "reward", RewardWorker, cfg.reward.group_name, strategies["reward"], cfg)
    launch_group(
        groups,
        cluster,
        "agent_loop",
        AgentLoopWorker,
        cfg.agentloop.group_name,
        strategies["agent_loop"],
        cfg,
        search_server_addr=search_server_addr,
        launcher_ip=launcher_ip,
    )
    ranks = component_ranks(cfg.cluster.component_placement, None, max(cfg.cluster.num_nodes, 1))
    # (node, process) pairs: the same pairs = the CPU stand-in of collocated GPUs (shared memory, rank to rank)
    actor_at = list(zip(nodes["actor"], ranks.get("actor", [0])))
    rollout_at = list(zip(nodes["rollout"], ranks.get("rollout", [0])))
    placement = Placement(
        rollout_dp_size=len(nodes["rollout"]),
        agent_loop_world_size=len(nodes["agent_loop"]),
        actor_world_size=len(nodes["actor"]),
        weight_sync=SyncRoutes(sync_mode(actor_at, rollout_at), len(nodes["actor"]), len(nodes["rollout"])),
    )
    return WorkerGroups(placement=placement, **groups)
