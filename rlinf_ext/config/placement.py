"""Component placement and batch arithmetic (pure functions; used by `validate` and `rlinf-ext plan`).

Placement follows RLinf's `cluster.component_placement` syntax for the subset rlinf_ext uses: a key names one
or more components (`"actor,rollout,reward"`), a value is `all`, a rank `3`, a range `0-3`, or a comma list
of those. On a GPU cluster ranks are global GPU ranks (node = rank // num_gpus_per_node). On a CPU cluster
(`num_gpus_per_node: 0`) ranks are worker processes on node 0 and `all` means one process (rank 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

COMPONENTS = ("actor", "rollout", "reward", "agentloop", "inference")


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


def placement_entries(placement: Mapping[str, Any], total: int | None) -> list[PlacementEntry]:
    """Every entry of ``cluster.component_placement`` parsed (the one reader of that key; ``total`` as in
    ``parse_ranks``). Problems are returned, not raised, so ``validate`` can list them all."""
    entries = []
    for key in placement:
        spec = placement[key]
        components = tuple(split_components(key))
        if isinstance(spec, Mapping) or hasattr(spec, "keys"):
            error = PlacementError("node-group placement mappings are not supported by rlinf_ext's planner.",
                                   "give GPU ranks directly, e.g. '0-7'.")
            entries.append(PlacementEntry(str(key), components, error=error))
            continue
        try:
            entries.append(PlacementEntry(str(key), components, tuple(parse_ranks(spec, total))))
        except PlacementError as exc:
            entries.append(PlacementEntry(str(key), components, error=exc))
    return entries


def component_ranks(placement: Mapping[str, Any], total: int | None) -> dict[str, list[int]]:
    """component -> ranks; the first unusable entry raises ``PlacementError`` naming its key."""
    out: dict[str, list[int]] = {}
    for entry in placement_entries(placement, total):
        if entry.error is not None:
            raise PlacementError(f"cluster.component_placement.{entry.key}: {entry.error.reason}", entry.error.fix)
        for name in entry.components:
            out[name] = list(entry.ranks)
    return out


@dataclass(frozen=True)
class ComponentPlan:
    name: str
    ranks: tuple[int, ...]  # global GPU ranks, or process ranks on node 0 for a CPU cluster
    gpus_per_node: int  # 0 = CPU cluster
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp)

    def nodes(self) -> dict[int, list[int]]:
        """node -> local GPU ranks (CPU cluster: node 0 -> process ranks)."""
        if self.gpus_per_node == 0:
            return {0: list(self.ranks)}
        out: dict[int, list[int]] = {}
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
