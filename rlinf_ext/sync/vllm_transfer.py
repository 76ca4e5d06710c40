"""Actor -> vLLM weight sync on GPUs through vllm 0.32.0's weight-transfer API (``vllm/distributed/weight_transfer/``),
NOT GPU-verified: the call order is tested on CPU with recording engines and vLLM's own NCCL trainer engine.

vLLM joins a trainer engine (here in actor rank 0) and a worker engine per vLLM worker by four control calls; the
engines live in the rollout workers, so ``RolloutEngineClient`` carries each as an ``EngineCall`` over RLinf messages
and waits for every rank's reply (``sync/vllm_engine_side.py:VLLMGpuSync``). ``ipc`` (collocated): all actor ranks'
CUDA IPC handles, shipped by rank 0 in one buffer (``ipc_buffer_bytes``) that vLLM allocates per send; every rank
then empties its CUDA cache and they meet at a barrier before ``SYNC_END`` wakes the engines' KV. ``nccl``
(disaggregated): rank 0 broadcasts to ``1 + engines x TP`` ranks (offset per engine: each ``AsyncLLM`` numbers its
workers from 0). NCCL waits have no timeout, so a watchdog bounds each; a timeout raises ``WeightSyncError``."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

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
from rlinf_ext.sync.weight_sync import SYNC_END, SyncHeader, SyncRoutes, release_cuda_cache

TransferBackend = Literal["ipc", "nccl"]
TRANSFER_BACKENDS = ("ipc", "nccl")  # the routes of the vLLM entry (protocol/engines.py) this module carries
INIT = "init_weight_transfer_engine"
START = "start_weight_update"
UPDATE = "update_weights"
FINISH = "finish_weight_update"
ENGINE_CALLS = (INIT, START, UPDATE, FINISH)


# ------------------------------------------------------------------------------------------------ choices (pure)
def transfer_backend(cfg: Any, cuda: bool) -> TransferBackend | None:
    """vLLM's backend for this run: ``ipc`` when actor and rollout share GPUs, ``nccl`` when they are apart, None
    off GPUs, for another engine (the RLinf routes of ``sync/weight_sync.py`` and vLLM's in-place reload) or
    without an actor (evaluation)."""
    route = gpu_route(cfg, cuda)
    return route if route in TRANSFER_BACKENDS else None


# ------------------------------------------------------------------------------------------------ actor side
class RolloutEngineClient(EngineCallClient):
    """vLLM's ``VLLMWeightSyncClient`` (structural) over RLinf (``sync/engine_calls.py:EngineCallClient``): each call
    goes from actor rank 0 to every rollout rank and returns once every rank has answered. The weights' version
    label is the rollout side's (``VLLMGpuSync.next_version``, from the driver), not a payload of FINISH."""

    engine_name = "vLLM"

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        tp = self.routes.rollout_tp
        self._call(INIT, [engine_init_info(init_info, r, tp) for r in range(self.routes.rollout_dp)])

    def start_weight_update(self) -> None:
        self._call(START, [None] * self.routes.rollout_dp)

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._call(UPDATE, [update_info] * self.routes.rollout_dp)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._call(FINISH, [weight_version] * self.routes.rollout_dp)


class HFWeightSource:
    """vLLM's ``WeightSource`` contract (``metadata()`` + a fresh ``(name, tensor)`` pass per iteration) over the
    actor's HF-named weights: ``passes()`` starts a conversion pass. The metadata costs one pass the first time
    (the names, dtypes and shapes of a conversion do not change between syncs) and is cached."""

    def __init__(self, passes: Callable[[], Iterable[tuple[str, torch.Tensor]]]):
        self.passes = passes
        self._meta: list | None = None

    def metadata(self) -> list:
        if self._meta is None:
            from vllm.distributed.weight_transfer.base import ParamMeta  # lazy: vllm, GPU routes only

            self._meta = [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.passes()]
        return self._meta

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.passes())

    def held_names(self) -> None:
        return None  # every data-parallel rank holds the whole model


def ipc_buffer_bytes(meta: Iterable[Any], bucket_bytes: int) -> int:
    """The packed IPC buffer's size (pure): ``bucket_bytes``, or the largest tensor of ``meta`` (vLLM's
    ``ParamMeta``) when that is larger: vLLM's packed IPC producer refuses a tensor larger than its buffer
    (``packed_tensor.py:packed_ipc_producer``), and a 7B model's embedding in bf16 (152064 x 3584 x 2 bytes) is
    larger than 1 GiB."""
    return max([int(bucket_bytes)] + [math.prod(m.shape) * m.dtype.itemsize for m in meta])


def trainer_init_info(
    backend: TransferBackend,
    routes: SyncRoutes,
    rank: int,
    bucket_bytes: int = BUCKET_BYTES,
    rendezvous: Callable[[], tuple[str, int]] = nccl_rendezvous,
) -> Any:
    """vLLM's trainer init info: packed transfers in buffers of ``bucket_bytes`` (bounded extra memory on both
    sides); NCCL: the rendezvous and the group size (rank 0 only opens it)."""
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo  # lazy: vllm, GPU routes only

        return IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=bucket_bytes)
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo  # lazy: vllm, GPU routes only

    host, port = rendezvous() if rank == 0 else ("", 0)
    return NCCLTrainerInitInfo(
        rank=rank,
        master_address=host,
        master_port=port,
        world_size=nccl_world_size(routes),
        packed=True,
        packed_buffer_size_bytes=bucket_bytes,
    )


def vllm_trainer_init(init_info: Any, *, client: Any, source: Any) -> Any:
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory  # lazy: vllm, GPU routes only

    return WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)


def actor_barrier() -> None:
    """A barrier of the actor ranks on the default process group, which vLLM's IPC trainer takes to be exactly the
    actor ranks (``ipc_engine.py:_all_gather_and_merge_handles``); nothing with one rank."""
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()


class VLLMTransferSender:
    """The actor side of one run's vLLM transfers (every actor rank holds one): the header to every rollout rank,
    then vLLM's trainer engine (made at the first sync, when the rollout ranks are listening) sends the weights,
    then (``ipc``) every rank frees its transfer memory and the ranks meet, then ``SYNC_END``. ``trainer_init`` is
    vLLM's factory (tests pass one whose broadcast runs on CPU)."""

    def __init__(
        self,
        worker: Any,
        backend: TransferBackend,
        routes: SyncRoutes,
        *,
        rollout_group: str,
        bucket_bytes: int = BUCKET_BYTES,
        timeout_s: float = SYNC_TIMEOUT_S,
        trainer_init: Callable[..., Any] = vllm_trainer_init,
        rendezvous: Callable[[], tuple[str, int]] = nccl_rendezvous,
    ):
        self.worker, self.backend, self.routes, self.timeout_s = worker, backend, routes, timeout_s
        self.rank = int(worker._rank)
        self.client = RolloutEngineClient(worker, rollout_group, routes, timeout_s)
        self.bucket_bytes, self._trainer_init, self._rendezvous = bucket_bytes, trainer_init, rendezvous
        self.source: HFWeightSource | None = None
        self.engine: Any = None

    @property
    def is_sender(self) -> bool:
        return self.rank == 0

    def _carries_weights(self) -> bool:
        """IPC: every rank's handles point at its own GPU; NCCL: rank 0 broadcasts, the others hold copies."""
        return self.backend == "ipc" or self.is_sender

    def sync(self, header: SyncHeader, passes: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        mine = passes if self._carries_weights() else (lambda: iter(()))
        if self.source is None:  # one source for the run: vLLM's trainer engine keeps it, the metadata stays cached
            self.source = HFWeightSource(mine)
        self.source.passes = mine
        if self.is_sender:
            self._to_every_rollout_rank(header, "the sync header")
        if self.engine is None:
            buffer_bytes = self.bucket_bytes
            if self.backend == "ipc":  # the metadata costs one conversion pass, at the first sync only
                buffer_bytes = ipc_buffer_bytes(self.source.metadata(), self.bucket_bytes)
            info = trainer_init_info(self.backend, self.routes, self.rank, buffer_bytes, self._rendezvous)
            self.engine = run_with_timeout(
                lambda: self._trainer_init(info, client=self.client, source=self.source),
                self.timeout_s,
                f"vLLM's {self.backend} weight-transfer rendezvous",
            )
        run_with_timeout(self.engine.send_weights, self.timeout_s, f"the {self.backend} weight transfer")
        if self.backend == "ipc":  # the engines wake their KV cache after SYNC_END: this GPU's share goes back first
            release_cuda_cache()
            run_with_timeout(actor_barrier, self.timeout_s, "the actor ranks' barrier after the transfer")
        if self.is_sender:
            self._to_every_rollout_rank(SYNC_END, "the end of the sync")

    def _to_every_rollout_rank(self, message: Any, what: str) -> None:
        self.client.to_every_rollout_rank([message] * self.routes.rollout_dp, what)

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
