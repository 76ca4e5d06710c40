"""Data parallelism of the Megatron-core actor: DP = number of actor processes, TP = PP = 1 in each.

Every DP rank holds the whole model. A rollout step's results (whole GRPO groups) are shared out over the
ranks; each mini-batch is the GLOBAL mini-batch of a one-process run (same samples, same order) of which
each rank back-propagates the samples it holds. Before the backward the ranks add up the mini-batch's
loss-token count here (token-mean over the global mini-batch); after it Megatron's DDP sums the gradients
(``training/optimizer.py``), so every rank clips on the global gradient norm and takes the same optimizer step:
N ranks give the update of one rank on the whole batch, up to float summation order. CPU: gloo; CUDA: nccl
for tensors and, when Megatron made one, the gloo data-parallel group for pickled objects (the CUDA path is
written, not GPU-verified).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


class DataParallelError(ValueError):
    """The rollout step cannot be shared over the actor's data-parallel ranks; the message names the fix."""


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the actor's data-parallel group (size 1 = no collectives at all)."""

    rank: int = 0
    size: int = 1
    group: Any = None  # tensors (gloo on CPU, nccl on CUDA)
    object_group: Any = None  # pickled objects (gloo)

    @classmethod
    def from_parallel_state(cls) -> DataParallel:
        """Megatron's data-parallel group, or a single rank when parallel_state is not initialised."""
        # heavy: Megatron is imported in the actor's process only (the launcher imports this module's helpers)
        from megatron.core import parallel_state

        if not (dist.is_initialized() and parallel_state.model_parallel_is_initialized()):
            return cls()
        size = parallel_state.get_data_parallel_world_size()
        if size <= 1:
            return cls()
        group = parallel_state.get_data_parallel_group()
        try:  # created on CUDA (create_gloo_process_groups=True); on CPU the group is gloo already
            object_group = parallel_state.get_data_parallel_group_gloo()
        except AssertionError:
            object_group = group
        return cls(parallel_state.get_data_parallel_rank(), size, group, object_group or group)

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over the ranks (identity with one rank)."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def sum_float(self, value: float, device: torch.device | str = "cpu") -> float:
        if not self.enabled:
            return float(value)
        # float64 so integer counts (loss tokens) stay exact
        return float(self.sum_(torch.tensor([value], dtype=torch.float64, device=device)).item())

    def gather_objects(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` (``[obj]`` with one rank)."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.object_group)
        return out


def unsupported_model_parallelism(tp: int, pp: int) -> str | None:
    """Why the actor cannot run with this tensor/pipeline parallelism, with the fix (None = it can): the
    Megatron-core actor runs TP=PP=1 per process and scales by data parallelism only."""
    if (tp, pp) == (1, 1):
        return None
    return (
        f"actor.model.tensor_model_parallel_size={tp}, pipeline_model_parallel_size={pp}: the Megatron-core actor "
        "runs TP=PP=1 per process (data parallelism over its processes/GPUs). Fix: set both to 1."
    )


def share_of(num_results: int, dp: DataParallel) -> int:
    """How many results (whole GRPO groups) each data-parallel rank takes from the channel."""
    if num_results % dp.size:
        raise DataParallelError(
            f"{num_results} rollout results (GRPO groups, one per prompt) cannot be shared equally over the "
            f"actor's {dp.size} data-parallel processes. Fix: make data.rollout_batch_size a multiple of {dp.size} "
            f"(e.g. {-(-num_results // dp.size) * dp.size}), or place the actor on a number of processes/GPUs "
            f"dividing {num_results} (cluster.component_placement)."
        )
    return num_results // dp.size


@dataclass(frozen=True)
class ShardLayout:
    """Where this rank's samples sit in the step's global sample order (results sorted by uid, then their
    trajectories in group order): ``global_index[i]`` is local sample i's position among ``global_size``."""

    global_index: tuple[int, ...]
    global_size: int


def shard_layout(local_uids: Sequence[str], local_sizes: Sequence[int], dp: DataParallel) -> ShardLayout:
    """Agree on the global order of the step's results from every rank's ``(uid, num_sequence)`` list.

    ``local_uids`` must be this rank's results in local order, already sorted by uid. Which rank took which
    result from the channel depends on arrival; the global order (and so every mini-batch) does not."""
    everyone = dp.gather_objects(list(zip(local_uids, local_sizes)))
    entries = sorted((uid, rank, size) for rank, items in enumerate(everyone) for uid, size in items)
    if len({uid for uid, _, _ in entries}) != len(entries):
        raise DataParallelError(
            "two rollout results share a uid; the actor orders results by uid. Fix: give every "
            "prompt of a step its own uid (the trainer prefixes them with the step and index)."
        )
    start, offsets = 0, {}
    for uid, rank, size in entries:
        offsets[uid] = start
        start += size
    index = [offsets[uid] + j for uid, size in zip(local_uids, local_sizes) for j in range(size)]
    return ShardLayout(tuple(index), start)


def merge_minibatch_metrics(per_rank: Sequence[dict[str, float]]) -> dict[str, float]:
    """Per-rank mini-batch metric dicts -> global ones: every value is already a share of the global
    token-mean (divided by the global token count, or weighted by tokens / global tokens), so they add up."""
    out: dict[str, float] = {}
    for metrics in per_rank:
        for key, value in metrics.items():
            out[key] = out.get(key, 0.0) + float(value)
    return out
