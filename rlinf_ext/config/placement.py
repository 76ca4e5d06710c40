"""Component placement and batch arithmetic (pure functions), and ``placements``: the plan `validate` and
`rlinf-ext plan` both read (component -> ranks, TP x PP, data-parallel size).

Placement follows RLinf's `cluster.component_placement` syntax for the subset rlinf_ext uses: a key names one
or more components (`"actor,rollout,reward"`), a value is `all`, a rank `3`, a range `0-3`, or a comma list
of those. On a GPU cluster ranks are global GPU ranks (node = rank // num_gpus_per_node). On a CPU cluster
(`num_gpus_per_node: 0`) ranks are worker processes on node 0 and `all` means one process (rank 0); RLinf's
`NODES:PROCESSES` form places them on other nodes, the processes spread evenly over the nodes in order
(`"1:0"` = one process on node 1, `"0-1:0-3"` = processes 0-1 on node 0 and 2-3 on node 1). Node numbers are
positions in the run's stable node order (sorted by IP, then Ray node id: `runner/cluster.py`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rlinf_ext.config.rule_registry import is_training
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue

COMPONENTS = ("actor", "rollout", "reward", "agentloop", "inference")

PlacementMode = Literal["collocated", "disaggregated"]
COLLOCATED: PlacementMode = "collocated"
DISAGGREGATED: PlacementMode = "disaggregated"


class PlacementError(ValueError):
    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason} Fix: {fix}")
        self.reason, self.fix = reason, fix


def parse_ranks(spec: object, total: int | None) -> list[int]:
    """`all` / `3` / `0-3` / `0-1,2-3` -> sorted ranks. total = number of GPUs, None on a CPU cluster."""
    text = str(spec).strip()
    if text == "all":
        return list(range(total)) if total is not None else [0]
    if ":" in text:
        raise PlacementError(
            f"'{text}' uses RLinf's resource:process syntax, which rlinf_ext's planner does not support.",
            "give plain GPU ranks such as 0-3 (one process per GPU).",
        )
    ranks: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo_s, dash, hi_s = part.partition("-")
        if not lo_s.isdigit() or (dash and not hi_s.isdigit()):
            raise PlacementError(f"'{part}' is not a rank or a range.", "write all, N, A-B or a comma list of them.")
        lo, hi = int(lo_s), int(hi_s) if dash else int(lo_s)
        if hi < lo:
            raise PlacementError(f"range '{part}' is empty (end < start).", f"write {hi}-{lo}.")
        ranks += range(lo, hi + 1)
    if len(set(ranks)) != len(ranks):
        raise PlacementError(f"'{text}' lists a rank twice.", "list each rank once.")
    ranks.sort()
    if total is not None and ranks[-1] >= total:
        raise PlacementError(
            f"'{text}' reaches rank {ranks[-1]} but the cluster has {total} GPUs (ranks 0-{total - 1}).",
            f"use ranks within 0-{total - 1}, or raise cluster.num_nodes / cluster.num_gpus_per_node.",
        )
    if ranks != list(range(ranks[0], ranks[-1] + 1)):
        raise PlacementError(
            f"'{text}' is not contiguous.", f"use one range, e.g. {ranks[0]}-{ranks[0] + len(ranks) - 1}."
        )
    return ranks


def split_components(key: str) -> list[str]:
    return [c.strip() for c in str(key).split(",") if c.strip()]


@dataclass(frozen=True)
class PlacementEntry:
    """One ``cluster.component_placement`` entry, parsed: its components and ranks, or why it cannot be used."""

    key: str
    components: tuple[str, ...]
    ranks: tuple[int, ...] = ()
    error: PlacementError | None = None
    nodes: tuple[int, ...] = ()  # CPU cluster: the node of each process rank (same length as ranks)


def parse_cpu_spec(spec: object, num_nodes: int) -> tuple[list[int], list[int]]:
    """A CPU-cluster value -> (process ranks, node of each process). ``P`` puts processes P on node 0;
    ``N:P`` spreads processes P evenly over nodes N, in order (RLinf's resource:process form)."""
    text = str(spec).strip()
    nodes_text, colon, procs_text = text.partition(":")
    if not colon:
        ranks = parse_ranks(text, None)
        return ranks, [0] * len(ranks)
    if ":" in procs_text or "," in nodes_text:
        raise PlacementError(
            f"'{text}' has more than one NODES:PROCESSES part.",
            "write one range of nodes and one range of processes, e.g. 0-1:0-3.",
        )
    nodes = parse_ranks(nodes_text, None)
    if nodes[-1] >= num_nodes:
        raise PlacementError(
            f"'{text}' puts processes on node {nodes[-1]} but cluster.num_nodes is {num_nodes} "
            f"(nodes 0-{num_nodes - 1}).",
            f"use nodes within 0-{num_nodes - 1}, or raise cluster.num_nodes.",
        )
    ranks = parse_ranks(procs_text, None)
    if ranks[0] != 0 or len(ranks) % len(nodes):
        raise PlacementError(
            f"'{text}': processes {fmt_ranks(ranks)} do not split evenly over {len(nodes)} node(s) starting at 0.",
            f"give a multiple of {len(nodes)} processes from 0, e.g. {nodes_text}:0-{len(nodes) - 1}.",
        )
    per_node = len(ranks) // len(nodes)
    return ranks, [nodes[i // per_node] for i in range(len(ranks))]


def placement_entries(placement: Mapping[str, Any], total: int | None, num_nodes: int = 1) -> list[PlacementEntry]:
    """Every entry of ``cluster.component_placement`` parsed (the one reader of that key; ``total`` as in
    ``parse_ranks``, ``num_nodes`` bounds a CPU cluster's ``NODES:PROCESSES`` form). Problems are returned, not
    raised, so ``validate`` can list them all."""
    entries = []
    for key in placement:
        spec = placement[key]
        components = tuple(split_components(key))
        if isinstance(spec, Mapping) or hasattr(spec, "keys"):
            error = PlacementError(
                "node-group placement mappings are not supported by rlinf_ext's planner.",
                "give GPU ranks directly, e.g. '0-7' (CPU cluster: NODES:PROCESSES, e.g. '1:0').",
            )
            entries.append(PlacementEntry(str(key), components, error=error))
            continue
        try:
            if total is None:
                ranks, nodes = parse_cpu_spec(spec, num_nodes)
                entries.append(PlacementEntry(str(key), components, tuple(ranks), nodes=tuple(nodes)))
            else:
                entries.append(PlacementEntry(str(key), components, tuple(parse_ranks(spec, total))))
        except PlacementError as exc:
            entries.append(PlacementEntry(str(key), components, error=exc))
    return entries


def checked_entries(placement: Mapping[str, Any], total: int | None, num_nodes: int = 1) -> list[PlacementEntry]:
    """``placement_entries``; the first unusable entry raises ``PlacementError`` naming its key."""
    entries = placement_entries(placement, total, num_nodes)
    for entry in entries:
        if entry.error is not None:
            raise PlacementError(f"cluster.component_placement.{entry.key}: {entry.error.reason}", entry.error.fix)
    return entries


def component_ranks(placement: Mapping[str, Any], total: int | None, num_nodes: int = 1) -> dict[str, list[int]]:
    """component -> ranks; the first unusable entry raises ``PlacementError`` naming its key."""
    out: dict[str, list[int]] = {}
    for entry in checked_entries(placement, total, num_nodes):
        for name in entry.components:
            out[name] = list(entry.ranks)
    return out


def component_nodes(placement: Mapping[str, Any], num_nodes: int) -> dict[str, list[int]]:
    """CPU cluster: component -> the node of each of its processes (``PlacementError`` as ``component_ranks``)."""
    return {
        name: list(entry.nodes) for entry in checked_entries(placement, None, num_nodes) for name in entry.components
    }


@dataclass(frozen=True)
class ComponentPlan:
    name: str
    ranks: tuple[int, ...]  # global GPU ranks, or process ranks for a CPU cluster
    gpus_per_node: int  # 0 = CPU cluster
    tp: int = 1
    pp: int = 1
    process_nodes: tuple[int, ...] = ()  # CPU cluster: the node of each process (empty = all on node 0)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp)

    def nodes(self) -> dict[int, list[int]]:
        """node -> local GPU ranks (CPU cluster: node -> process ranks)."""
        out: dict[int, list[int]] = {}
        if self.gpus_per_node == 0:
            nodes = self.process_nodes or (0,) * len(self.ranks)
            for r, node in zip(self.ranks, nodes):
                out.setdefault(node, []).append(r)
            return out
        for r in self.ranks:
            out.setdefault(r // self.gpus_per_node, []).append(r % self.gpus_per_node)
        return out


@dataclass(frozen=True)
class BatchPlan:
    prompts_per_step: int
    group_size: int
    n_minibatches: int
    data_parallel_size: int
    micro_batch_size: int

    @property
    def trajectories_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def trajectories_per_minibatch(self) -> int:
        return self.trajectories_per_step // self.n_minibatches

    @property
    def trajectories_per_rank_per_minibatch(self) -> int:
        return self.trajectories_per_minibatch // self.data_parallel_size

    @property
    def micro_batches_per_rank_per_minibatch(self) -> int:
        return self.trajectories_per_rank_per_minibatch // self.micro_batch_size

    @property
    def optimizer_steps_per_rollout_step(self) -> int:
        return self.n_minibatches


def fmt_ranks(ranks: list[int]) -> str:
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"


# ------------------------------------------------------------------------------------------ the plan
_PARALLEL_KEYS = {
    "actor": ("actor.model.tensor_model_parallel_size", "actor.model.pipeline_model_parallel_size"),
    "rollout": ("rollout.tensor_parallel_size", "rollout.pipeline_parallel_size"),
}


def placements(cfg: ExperimentConfig) -> tuple[dict[str, ComponentPlan], list[ConfigIssue]]:
    """component -> plan, with issues for bad ranks, unknown components and TP x PP mismatches."""
    cluster = cfg.cluster
    gpn = cluster.num_gpus_per_node
    total = cluster.num_nodes * gpn if gpn > 0 else None
    parallel = {
        "actor": (cfg.actor.model.tensor_model_parallel_size, cfg.actor.model.pipeline_model_parallel_size),
        "rollout": (cfg.rollout.tensor_parallel_size, cfg.rollout.pipeline_parallel_size),
    }
    plans: dict[str, ComponentPlan] = {}
    issues: list[ConfigIssue] = []
    for entry in placement_entries(cluster.component_placement, total, max(cluster.num_nodes, 1)):
        dotted = f"cluster.component_placement.{entry.key}"
        if entry.error is not None:
            issues.append(ConfigIssue(dotted, entry.error.reason, entry.error.fix))
            continue
        ranks = entry.ranks
        for name in entry.components:
            if name not in COMPONENTS:
                close = difflib.get_close_matches(name, COMPONENTS, n=2)
                fix = (
                    f"did you mean {' or '.join(close)}?" if close else f"use component names {', '.join(COMPONENTS)}."
                )
                issues.append(ConfigIssue(dotted, f"unknown component '{name}'.", fix))
                continue
            if name in plans:
                issues.append(ConfigIssue(dotted, f"component '{name}' is placed twice.", "place each component once."))
                continue
            tp, pp = parallel.get(name, (1, 1))
            plans[name] = ComponentPlan(name, tuple(ranks), gpn, tp, pp, process_nodes=entry.nodes)
    for name, (tp, pp) in parallel.items():
        plan = plans.get(name)
        if plan is None:
            continue
        tp_key, pp_key = _PARALLEL_KEYS[name]
        if tp < 1 or pp < 1:
            key = tp_key if tp < 1 else pp_key
            issues.append(ConfigIssue(key, f"TP={tp}, PP={pp}: both must be >= 1.", f"set {key}=1 or more."))
        elif plan.world_size % (tp * pp):
            issues.append(
                ConfigIssue(
                    tp_key,
                    f"TP x PP = {tp} x {pp} = {tp * pp} does not divide the {plan.world_size} ranks of {name} "
                    f"({spec_of(cfg, name)}).",
                    f"choose TP x PP dividing {plan.world_size}, or place {name} on a multiple of {tp * pp} GPUs.",
                )
            )
    required = ("actor", "rollout", "reward") if is_training(cfg) else ("rollout", "reward")
    for name in required:
        if name not in plans and not any(name in split_components(k) for k in cluster.component_placement):
            issues.append(
                ConfigIssue(
                    "cluster.component_placement",
                    f"component '{name}' has no placement.",
                    "add it, e.g. cluster.component_placement={'actor,rollout,reward': all}.",
                )
            )
    actor, rollout = plans.get("actor"), plans.get("rollout")
    if gpn > 0 and actor is not None and rollout is not None:
        try:
            mode_of_ranks(actor.ranks, rollout.ranks)
        except PlacementError as exc:
            issues.append(ConfigIssue("cluster.component_placement", exc.reason, exc.fix))
    return plans, issues


def spec_of(cfg: ExperimentConfig, name: str) -> str:
    for key, spec in cfg.cluster.component_placement.items():
        if name in split_components(key):
            return f"{key}: {spec}"
    return "unplaced"


# ------------------------------------------------------------------------------------------ collocation
def mode_of_ranks(actor: Sequence[int] | None, rollout: Sequence[int] | None) -> PlacementMode:
    """Collocated: the actor and the rollout on the same GPUs (they take turns: the engine gives its memory back
    while the actor trains); disaggregated: on disjoint GPUs, or one of them unplaced (evaluation has no actor).
    A partial overlap raises ``PlacementError``: RLinf places either the same GPUs or disjoint ones."""
    if not actor or not rollout or set(actor).isdisjoint(rollout):
        return DISAGGREGATED
    if set(actor) == set(rollout):
        return COLLOCATED
    raise PlacementError(
        f"actor GPUs {fmt_ranks(sorted(actor))} and rollout GPUs {fmt_ranks(sorted(rollout))} overlap partly; RLinf "
        "places actor and rollout on the same GPUs (collocated) or on disjoint ones (disaggregated).",
        "make the actor's and the rollout's ranks in cluster.component_placement equal or disjoint.",
    )


def placement_mode(cfg: ExperimentConfig) -> PlacementMode:
    """``mode_of_ranks`` for the config's placement. A CPU cluster (``num_gpus_per_node: 0``) is disaggregated: its
    ranks are processes, and no GPU is shared. An unusable placement raises ``PlacementError``."""
    gpn = cfg.cluster.num_gpus_per_node
    if gpn < 1:
        return DISAGGREGATED
    ranks = component_ranks(cfg.cluster.component_placement, cfg.cluster.num_nodes * gpn)
    return mode_of_ranks(ranks.get("actor"), ranks.get("rollout"))


def is_collocated(cfg: ExperimentConfig) -> bool:
    return placement_mode(cfg) == COLLOCATED
