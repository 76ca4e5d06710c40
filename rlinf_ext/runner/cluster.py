"""The Ray cluster a run joins: its address, waiting for the nodes, a stable node order, checking that the placement
fits, pinning every worker to this cluster, and naming lost nodes.

RLinf orders nodes head first, then by IP string (``rlinf/scheduler/cluster/node.py``), which depends on where the
driver runs; the run's order is by IP (numerically), then Ray node id, and ``NodeOrder.rlinf_rank`` translates
placement node ``k`` for ``NodePlacementStrategy``. GPU placement keeps RLinf's ranks (the launcher runs on the head).
Every RLinf worker gets ``RAY_ADDRESS`` = this cluster's GCS through ``NodeInfo.env_vars``, so a process it starts
with ``ray.init(address="auto")`` (RLinf's ``Worker`` inside SGLang's schedulers) joins this cluster, never a new one
(``RAY_ADDRESS=local``) or another Ray on the machine."""

from __future__ import annotations

import ipaddress
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import ray

from rlinf_ext.config.placement import PlacementError, component_nodes, component_ranks
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.runner.errors import LaunchError

RAY_ADDRESS_ENV = "RAY_ADDRESS"
PRIVATE_INSTANCE = "local"  # Ray's address for "start a new instance owned by this driver"
# Ray starts one idle worker per CPU for the first driver; every RLinf worker carries a runtime_env, which those
# idle workers lack, so none is ever used: a private instance starts without them (the user's setting wins)
PRIVATE_INSTANCE_ENV = {"RAY_prestart_worker_first_driver": "0"}
JOIN_FIX = (
    "start Ray on every node first: `ray start --head --port=6379` on the first node, "
    "`ray start --address=HEAD_IP:6379` on the others (examples/searchr1/multinode/), then launch on the head"
)


def ray_address_for(num_nodes: int, environ: dict[str, str], configured: str | None = None) -> str | None:
    """The Ray address the run uses: ``cluster.ray_address``, else ``RAY_ADDRESS``, else for one node ``"local"``
    (a private instance started and stopped by this run; RLinf's ``address="auto"`` would join *any* Ray on the
    machine), else None (several nodes: Ray's auto-detection of the cluster ``ray start`` joined on this node)."""
    if configured:
        return configured
    if environ.get(RAY_ADDRESS_ENV):
        return environ[RAY_ADDRESS_ENV]
    return PRIVATE_INSTANCE if num_nodes <= 1 else None


# ---------------------------------------------------------------- nodes and their order
@dataclass(frozen=True)
class NodeView:
    """One Ray node as the run sees it."""

    ip: str
    node_id: str
    cpus: float = 0.0
    gpus: float = 0.0
    rlinf_rank: int = -1  # RLinf's node rank (-1 before RLinf's Cluster numbered it)

    def label(self) -> str:
        return f"{self.ip}, Ray node {self.node_id[:8]}"


def _ip_key(ip: str) -> tuple[int, Any]:
    try:
        return (0, ipaddress.ip_address(ip))
    except ValueError:  # a host name: after every IP, by name
        return (1, ip)


def stable_order(nodes: Sequence[NodeView]) -> list[NodeView]:
    """Nodes sorted by IP (numerically), then Ray node id: the same order whichever node the driver runs on."""
    return sorted(nodes, key=lambda n: (_ip_key(n.ip), n.node_id))


def nodes_from_ray(listing: Sequence[dict]) -> list[NodeView]:
    """``ray.nodes()`` entries -> the alive nodes."""
    return [
        NodeView(
            n["NodeManagerAddress"],
            n["NodeID"],
            float(n["Resources"].get("CPU", 0)),
            float(n["Resources"].get("GPU", 0)),
        )
        for n in listing
        if n.get("Alive")
    ]


@dataclass
class NodeOrder:
    """The run's nodes in stable order; ``nodes[k]`` is placement node ``k``."""

    nodes: list[NodeView]

    @classmethod
    def of_cluster(cls, cluster: Any) -> "NodeOrder":
        """From RLinf's ``Cluster`` (the nodes it kept, with their RLinf ranks)."""
        views = []
        for rank in range(cluster.num_nodes):
            info = cluster.get_node_info(rank)
            views.append(
                NodeView(info.node_ip, info.ray_id, float(info.num_cpus), float(info.num_accelerators), rlinf_rank=rank)
            )
        return cls(stable_order(views))

    @classmethod
    def single(cls) -> "NodeOrder":
        """Placement node 0 = RLinf rank 0 (compositions built without a cluster check, e.g. in tests)."""
        return cls([NodeView("127.0.0.1", "", rlinf_rank=0)])

    def rlinf_rank(self, node: int) -> int:
        if not 0 <= node < len(self.nodes):
            raise PlacementError(
                f"placement node {node} does not exist: the cluster has {len(self.nodes)} node(s).",
                f"use nodes 0-{len(self.nodes) - 1}, or start more nodes.",
            )
        return self.nodes[node].rlinf_rank

    def table(self) -> str:
        return "\n".join(
            f"  node {k}: {n.label()}, {n.cpus:g} CPU(s), {n.gpus:g} GPU(s), RLinf rank {n.rlinf_rank}"
            for k, n in enumerate(self.nodes)
        )


# ---------------------------------------------------------------- what the placement needs from each node
@dataclass
class NodeNeed:
    components: list[str] = field(default_factory=list)  # CPU worker processes placed there, by component
    gpus: int = 0


def cpu_process_nodes(cfg: ExperimentConfig) -> dict[str, list[int]]:
    """CPU cluster: component -> the placement node of each of its worker processes. The reward worker is one
    process; the agent loop has one process per rollout process, on the rollout's nodes unless placed itself."""
    placed = component_nodes(cfg.cluster.component_placement, max(cfg.cluster.num_nodes, 1))
    rollout = placed.get("rollout", [0])
    agent_loop = placed.get("agentloop", rollout)
    if len(agent_loop) != len(rollout):
        raise PlacementError(
            f"cluster.component_placement: the agent loop has {len(agent_loop)} process(es) but the rollout has "
            f"{len(rollout)}; each agent-loop process pairs with one rollout process.",
            f"place agentloop on {len(rollout)} process(es), or leave it out (it follows the rollout).",
        )
    return {
        "rollout": rollout,
        "actor": placed.get("actor", [0]),
        "reward": placed.get("reward", [0])[:1],
        "agent_loop": agent_loop,
    }


def placement_needs(cfg: ExperimentConfig) -> dict[int, NodeNeed]:
    """Placement node -> what runs there. GPU cluster: the GPUs of the ranks placed on it; reward and agent loop
    are CPU processes on node 0."""
    needs: dict[int, NodeNeed] = {}
    gpn = cfg.cluster.num_gpus_per_node
    if gpn <= 0:
        for component, nodes in cpu_process_nodes(cfg).items():
            for node in nodes:
                needs.setdefault(node, NodeNeed()).components.append(component)
        return needs
    total = cfg.cluster.num_nodes * gpn
    for ranks in component_ranks(cfg.cluster.component_placement, total).values():
        for r in ranks:
            need = needs.setdefault(r // gpn, NodeNeed())
            need.gpus = max(need.gpus, r % gpn + 1)
    needs.setdefault(0, NodeNeed()).components += ["reward", "agent_loop"]
    return needs


def placement_problems(nodes: Sequence[NodeView], needs: dict[int, NodeNeed], num_nodes: int) -> list[str]:
    """What keeps the placement from fitting ``nodes`` (stable order), one line each; empty when it fits.

    Ray schedules an actor only on a node with a free CPU (actors hold none once placed), so a node that hosts
    CPU workers needs at least one CPU; GPU components need the GPUs their ranks name on that node."""
    problems = []
    if len(nodes) < num_nodes:
        problems.append(f"cluster.num_nodes={num_nodes} but only {len(nodes)} node(s) are in the Ray cluster")
    for k, need in sorted(needs.items()):
        if k >= len(nodes):
            continue
        node = nodes[k]
        where = f"node {k} ({node.label()})"
        if need.components and node.cpus < 1:
            problems.append(
                f"{where} hosts {', '.join(sorted(set(need.components)))} but Ray gives it 0 CPUs "
                "(start it with `ray start --num-cpus=N`, N >= 1)"
            )
        if need.gpus > node.gpus:
            problems.append(
                f"{where} has {node.gpus:g} GPU(s); the placement uses {need.gpus} there "
                "(cluster.num_gpus_per_node / cluster.component_placement)"
            )
    return problems


def check_placement_fits(order: NodeOrder, cfg: ExperimentConfig) -> None:
    """LaunchError naming every missing node or resource, before any worker group starts."""
    try:
        needs = placement_needs(cfg)
    except PlacementError as exc:
        raise LaunchError(f"cluster: {exc}") from exc
    # a GPU cluster's node numbers are RLinf's ranks (global GPU ranks); a CPU cluster's the stable order
    nodes = sorted(order.nodes, key=lambda n: n.rlinf_rank) if cfg.cluster.num_gpus_per_node > 0 else order.nodes
    problems = placement_problems(nodes, needs, cfg.cluster.num_nodes)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise LaunchError(
            f"cluster: the placement does not fit the Ray cluster; nothing was started:\n{lines}\n"
            f"nodes (stable order):\n{order.table()}"
        )


# ---------------------------------------------------------------- joining: wait for the nodes
def wait_for_nodes(address: str | None, num_nodes: int, timeout_s: float, poll_s: float = 1.0) -> list[NodeView]:
    """Connect to the cluster at ``address`` (None: Ray's auto-detection), wait until ``num_nodes`` nodes are
    alive, disconnect. LaunchError when Ray is unreachable or the nodes do not come within ``timeout_s``
    (RLinf's ``Cluster`` itself would wait forever)."""
    try:
        ray.init(address=address or "auto", namespace="rlinf_ext_join", logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise LaunchError(
            f"cluster: cannot reach the Ray cluster at {address or 'auto'}: {exc}. Fix: {JOIN_FIX}, "
            "and set RAY_ADDRESS=HEAD_IP:6379 or cluster.ray_address."
        ) from exc
    try:
        deadline = time.monotonic() + timeout_s
        next_note = time.monotonic() + 10.0
        while True:
            nodes = stable_order(nodes_from_ray(ray.nodes()))
            if len(nodes) >= num_nodes:
                return nodes
            if time.monotonic() >= deadline:
                seen = "\n".join(f"  {n.label()}, {n.cpus:g} CPU(s), {n.gpus:g} GPU(s)" for n in nodes)
                raise LaunchError(
                    f"cluster: cluster.num_nodes={num_nodes} but {len(nodes)} node(s) joined the Ray cluster at "
                    f"{ray.get_runtime_context().gcs_address} within {timeout_s:g} s (cluster.join_timeout_s):\n"
                    f"{seen}\nFix: start the missing node(s) with `ray start --address=...`, or lower "
                    "cluster.num_nodes."
                )
            if time.monotonic() >= next_note:
                print(f"[launch] waiting for {num_nodes} Ray nodes, {len(nodes)} joined so far", flush=True)
                next_note += 10.0
            time.sleep(poll_s)
    finally:
        ray.shutdown()


# ---------------------------------------------------------------- workers join this cluster, and only this one
def pin_workers_to_cluster(cluster: Any, gcs_address: str) -> None:
    """Give every worker RLinf starts from now on ``RAY_ADDRESS=gcs_address`` (RLinf copies a node's
    ``env_vars`` into each worker's runtime environment), and the driver too."""
    os.environ[RAY_ADDRESS_ENV] = gcs_address
    for rank in range(cluster.num_nodes):
        cluster.get_node_info(rank).env_vars[RAY_ADDRESS_ENV] = gcs_address


# ---------------------------------------------------------------- nodes lost mid-run
def lost_nodes(order: NodeOrder, alive_ids: set[str]) -> list[tuple[int, NodeView]]:
    """(placement node, view) of every node of the run that is no longer alive."""
    return [(k, n) for k, n in enumerate(order.nodes) if n.node_id not in alive_ids]


def alive_node_ids() -> set[str]:
    return {n.node_id for n in nodes_from_ray(ray.nodes())}


def describe_lost(lost: list[tuple[int, NodeView]], needs: dict[int, NodeNeed]) -> str:
    parts = []
    for k, node in lost:
        hosted = sorted(set(needs.get(k, NodeNeed()).components))
        parts.append(f"node {k} ({node.label()}" + (f"; it hosted {', '.join(hosted)})" if hosted else ")"))
    return "; ".join(parts)
