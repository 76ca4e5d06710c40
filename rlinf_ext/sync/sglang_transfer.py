"""Actor -> SGLang weight sync for disaggregated engines through sglang 0.5.23's ``init_weights_update_group`` and
``update_weights_from_distributed`` (NOT GPU-verified; call order tested on CPU, tests/sync/test_sglang_transfer.py).

SGLang's TP workers join a group of ``world_size`` ranks as ``rank_offset + tp_rank`` (``init_custom_process_group``,
TCP rendezvous); per update call they allocate one tensor per (name, dtype, shape) and receive each by
``broadcast(src=0)`` in that order. Actor rank 0 is rank 0 of ``1 + engines x TP`` (engine ``e`` at ``1 + e x TP``),
made with the same ``init_custom_process_group``. Per sync: the header; at the first sync ``init_weights_update_group``
while it joins; per bucket the metadata as the call while it broadcasts; ``SYNC_END``. Other actor ranks send nothing.
Every wait is bounded (``sync/engine_calls.py``); a timeout leaves the group unusable: restart the run."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from rlinf_ext.models.memory import BUCKET_BYTES
from rlinf_ext.sync.engine_calls import (
    SYNC_TIMEOUT_S,
    EngineCallClient,
    engine_init_info,
    gpu_route,
    nccl_rendezvous,
    nccl_world_size,
    run_with_timeout,
)
from rlinf_ext.sync.weight_sync import SYNC_END, SyncHeader, SyncRoutes

DISTRIBUTED = "distributed"  # the SGLang entry's disaggregated route (protocol/engines.py), carried here
GROUP_NAME = "rlinf_ext_weight_update"
INIT_GROUP = "init_weights_update_group"
UPDATE_DISTRIBUTED = "update_weights_from_distributed"
SGLANG_CALLS = (INIT_GROUP, UPDATE_DISTRIBUTED)


# ------------------------------------------------------------------------------------------------ pure parts
def uses_sglang_distributed(cfg: Any, cuda: bool) -> bool:
    """This route: SGLang rollout on GPUs apart from the actor's (collocated SGLang keeps the CUDA-IPC route of
    ``sync/weight_sync.py``; evaluation has no actor)."""
    return gpu_route(cfg, cuda) == DISTRIBUTED


def dtype_name(dtype: torch.dtype) -> str:
    """SGLang's dtype string: it rebuilds the dtype with ``getattr(torch, name)``."""
    return str(dtype).removeprefix("torch.")


def named_buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive ``(name, tensor)`` runs of at most ``bucket_bytes`` (a larger tensor alone), in order: the
    engine holds one bucket's received tensors at a time (pure)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def update_request(bucket: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """The ``update_weights_from_distributed`` arguments of one bucket (pure): names, dtypes and shapes in the
    order the tensors are broadcast; no flush per bucket (the worker flushes once after the session)."""
    return {
        "names": [n for n, _ in bucket],
        "dtypes": [dtype_name(t.dtype) for _, t in bucket],
        "shapes": [list(t.shape) for _, t in bucket],
        "group_name": GROUP_NAME,
        "flush_cache": False,
    }


# ------------------------------------------------------------------------------------------------ GPU parts (thin)
def sglang_init_group(*, master_address: str, master_port: int, world_size: int, rank: int, group_name: str) -> Any:
    """The group as SGLang's TP workers make it (``init_custom_process_group``, NCCL, TCP rendezvous); sglang is
    imported here only: the SGLang profile's."""
    from sglang.srt.utils import init_custom_process_group

    host = f"[{master_address}]" if ":" in master_address else master_address
    return init_custom_process_group(
        backend="nccl",
        init_method=f"tcp://{host}:{master_port}",
        world_size=world_size,
        rank=rank,
        group_name=group_name,
    )


def nccl_broadcast(tensors: list[torch.Tensor], group: Any) -> None:
    """Rank 0's side of the engines' per-tensor ``broadcast(src=0)``, waited on the GPU before returning (so the
    watchdog covers the transfer, not only its launch)."""
    for tensor in tensors:
        torch.distributed.broadcast(tensor.contiguous(), src=0, group=group)
    torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------ actor side
class SGLangDistributedSender:
    """The actor side of one run's SGLang distributed transfers (every actor rank holds one; rank 0 sends).
    ``init_group`` and ``broadcast`` are SGLang's group and NCCL's broadcast (tests pass recorders)."""

    def __init__(
        self,
        worker: Any,
        routes: SyncRoutes,
        *,
        rollout_group: str,
        bucket_bytes: int = BUCKET_BYTES,
        timeout_s: float = SYNC_TIMEOUT_S,
        init_group: Callable[..., Any] = sglang_init_group,
        broadcast: Callable[[list[torch.Tensor], Any], None] = nccl_broadcast,
        rendezvous: Callable[[], tuple[str, int]] = nccl_rendezvous,
    ):
        self.rank, self.routes, self.timeout_s, self.bucket_bytes = int(worker._rank), routes, timeout_s, bucket_bytes
        self.client = EngineCallClient(worker, rollout_group, routes, timeout_s)
        self.client.engine_name = "SGLang"
        self._init_group, self._broadcast, self._rendezvous = init_group, broadcast, rendezvous
        self.group: Any = None

    backend = "sglang_distributed"

    @property
    def is_sender(self) -> bool:
        return self.rank == 0

    def sync(self, header: SyncHeader, passes: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        if not self.is_sender:  # the other ranks hold the same weights
            return
        self.client.to_every_rollout_rank([header] * self.routes.rollout_dp, "the sync header")
        if self.group is None:
            self._join()
        for bucket in named_buckets(passes(), self.bucket_bytes):
            self.client.send(UPDATE_DISTRIBUTED, [update_request(bucket)] * self.routes.rollout_dp)
            run_with_timeout(
                lambda b=bucket: self._broadcast([t for _, t in b], self.group),
                self.timeout_s,
                f"the broadcast of {len(bucket)} weight(s) to the SGLang engines",
            )
            self.client.collect(UPDATE_DISTRIBUTED)
        self.client.to_every_rollout_rank([SYNC_END] * self.routes.rollout_dp, "the end of the sync")

    def _join(self) -> None:
        """Every engine starts joining (its call waits for the whole group), then this rank; then the answers."""
        host, port = self._rendezvous()
        world = nccl_world_size(self.routes)
        info = {
            "master_address": host,
            "master_port": port,
            "rank_offset": 1,
            "world_size": world,
            "group_name": GROUP_NAME,
            "backend": "nccl",
        }
        tp = self.routes.rollout_tp
        self.client.send(INIT_GROUP, [engine_init_info(info, e, tp) for e in range(self.routes.rollout_dp)])
        self.group = run_with_timeout(
            lambda: self._init_group(
                master_address=host, master_port=port, world_size=world, rank=0, group_name=GROUP_NAME
            ),
            self.timeout_s,
            "the SGLang weight-update group's rendezvous",
        )
        self.client.collect(INIT_GROUP)

    def shutdown(self) -> None:
        if self.group is not None:
            torch.distributed.destroy_process_group(self.group)
            self.group = None
