"""Actor -> rollout weight sync (docs/contracts.md §6): routes, messages, transport and the probe check.

The actor converts its weights to HF names unit by unit (``convert/mapping.py:iter_megatron_to_hf``) in the
rollout's dtype on its own device, packed into buckets of at most ``BUCKET_BYTES``. ``paired`` (same ranks): actor
rank ``r`` feeds rollout rank ``r // tp`` as TP slot ``r % tp`` (RLinf's ``CollocateRankMapper``), sending only
handles pickled by torch's ``ForkingPickler`` (CUDA IPC on GPU, what SGLang's ``update_weights_from_tensor`` takes;
shared memory on CPU); a bucket is freed only once the rollout acknowledged it (the producer must outlive the
handle's use). ``broadcast`` (disjoint ranks): actor rank 0 sends each bucket with RLinf's ``Worker.broadcast``.
The rollout runs the header's probe after the last bucket and refuses a mismatch: bad mappings or loads fail at once."""

from __future__ import annotations

import io
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Awaitable, Callable, Iterable, Iterator, Literal

import torch

from rlinf_ext.models.dtypes import PRECISIONS, dtype_of_hf_name, dtype_of_precision
from rlinf_ext.models.memory import BUCKET_BYTES
from rlinf_ext.protocol.engines import engine_dtype, engine_spec

PROBE_LENGTH = 16
DEFAULT_ATOL = 1e-3  # fp32 on both sides differs by summation order only (~1e-6); bf16 engines need more
SYNC_END = "rlinf_ext.weight_sync.end"  # the message after the last bucket
SYNC_ACK = "rlinf_ext.weight_sync.ack"  # paired route: the rollout has loaded a bucket (the actor may free it)

SyncMode = Literal["paired", "broadcast"]


class WeightSyncError(RuntimeError):
    """The rollout engine's weights do not reproduce the actor's logits after a sync, or the sync broke off."""


# ------------------------------------------------------------------------------------------------ routes (pure)
def sync_mode(actor_ranks: Iterable[int], rollout_ranks: Iterable[int]) -> SyncMode:
    """``paired`` when the actor and the rollout occupy the same ranks (collocated), else ``broadcast``."""
    return "paired" if list(actor_ranks) == list(rollout_ranks) else "broadcast"


@dataclass(frozen=True)
class SyncRoutes:
    """Who sends weights to whom (pure). ``rollout_tp`` = GPUs per rollout engine (1 on CPU)."""

    mode: SyncMode
    actor_world: int
    rollout_dp: int
    rollout_tp: int = 1

    def __post_init__(self):
        if self.mode == "paired" and self.actor_world != self.rollout_dp * self.rollout_tp:
            raise WeightSyncError(
                f"paired weight sync needs one actor rank per rollout GPU: {self.actor_world} actor ranks for "
                f"{self.rollout_dp} engine(s) x TP {self.rollout_tp}. Place actor and rollout on the same GPUs "
                "(collocated) or on disjoint ones (disaggregated)."
            )

    def targets_of(self, actor_rank: int) -> list[tuple[int, int]]:
        """``(rollout rank, TP slot)`` pairs this actor rank sends to (broadcast: rank 0 to every engine)."""
        if self.mode == "paired":
            return [(actor_rank // self.rollout_tp, actor_rank % self.rollout_tp)]
        return [(r, 0) for r in range(self.rollout_dp)] if actor_rank == 0 else []

    def sources_of(self, rollout_rank: int) -> list[int]:
        """The actor ranks a rollout rank receives from, in TP-slot order."""
        if self.mode == "paired":
            return [rollout_rank * self.rollout_tp + slot for slot in range(self.rollout_tp)]
        return [0]

    def broadcast_groups(self, actor_group: str, rollout_group: str) -> tuple[list, tuple[str, int]]:
        """``groups`` and ``src`` of RLinf's ``Worker.broadcast`` for the broadcast route."""
        return [(actor_group, 0), (rollout_group, list(range(self.rollout_dp)))], (actor_group, 0)


# ------------------------------------------------------------------------------------------------ messages
@dataclass
class SyncHeader:
    version: int  # actor optimizer steps so far (for logs: the engine's weight version is the driver's, passed to
    # the rollout's sync_model_from_actor(version))
    sender: int  # actor rank
    probe_ids: torch.Tensor | None = None  # [1, L]
    probe_logits: torch.Tensor | None = None  # [1, L, V] actor logits, fp32
    probe_images: list | None = None  # vision-language probe: its images (protocol.images.ImageRef), in order
    probe_positions: list[int] | None = None  # the positions compared (text after the image; None = all)


@dataclass
class WeightBucket:
    """Tensors of one dtype packed into one contiguous buffer (one IPC handle / one collective per bucket)."""

    flat: torch.Tensor
    names: list[str]
    shapes: list[tuple[int, ...]]

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        out, offset = [], 0
        for name, shape in zip(self.names, self.shapes):
            n = 1
            for d in shape:
                n *= d
            out.append((name, self.flat[offset : offset + n].view(shape)))
            offset += n
        return out


@dataclass
class HandleBucket:
    """A bucket as handles only: one ``ForkingPickler`` blob per tensor (views of one shared buffer)."""

    names: list[str]
    handles: list[bytes]
    nbytes: int  # bytes of the tensors the handles point at

    @property
    def wire_bytes(self) -> int:
        return sum(len(h) for h in self.handles)


def serialize_handle(tensor: torch.Tensor) -> bytes:
    """``tensor`` pickled as a handle (CUDA IPC / shared memory), byte for byte what SGLang's
    ``MultiprocessingSerializer.serialize`` makes (a ``ForkingPickler`` dump)."""
    buf = io.BytesIO()
    ForkingPickler(buf).dump(tensor)
    return buf.getvalue()


# CPU handles (the file_system strategy) register every shared buffer with torch's shared-memory manager process,
# and the client gives up when the manager's "OK" takes over 1 s (torch/lib/libshm/socket.h, Socket::recv polls
# 1000 ms): a loaded 2-core host can miss that window. The registration only tells the manager to unlink the file
# when its last user is gone, so repeating it is harmless
SHM_MANAGER_TIMEOUT = "Shared memory manager connection has timed out"
SHM_MANAGER_ATTEMPTS = 5


def retry_shm_manager(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, repeated (0.2 s, 0.4 s, ... apart) when torch's shared-memory manager answered too late."""
    for attempt in range(SHM_MANAGER_ATTEMPTS):
        try:
            return fn(*args)
        except RuntimeError as exc:
            if SHM_MANAGER_TIMEOUT not in str(exc) or attempt == SHM_MANAGER_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * 2**attempt)


def open_handle(blob: bytes) -> torch.Tensor:
    return retry_shm_manager(pickle.loads, blob)


def prepare_handles(device: torch.device) -> None:
    """Make this process's tensor handles openable by the rollout's processes. CUDA: SGLang's own patch, which
    names the GPU by UUID instead of a device index (the actor and the engine number their visible GPUs
    differently). CPU: shared-memory files, which an unrelated process can open (the default file-descriptor
    passing needs a multiprocessing parent)."""
    if device.type == "cuda":
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions  # lazy: the SGLang profile (0.5.23)

        monkey_patch_torch_reductions()
    else:
        torch.multiprocessing.set_sharing_strategy("file_system")


def share_bucket(bucket: WeightBucket) -> HandleBucket:
    return HandleBucket(list(bucket.names), [serialize_handle(t) for _, t in bucket.named_tensors()], bucket.nbytes)


def named_tensors_of(message: WeightBucket | HandleBucket) -> list[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` pairs of a received bucket (handles are opened: no copy)."""
    if isinstance(message, HandleBucket):
        return [(n, open_handle(h)) for n, h in zip(message.names, message.handles)]
    return message.named_tensors()


def pack_buckets(
    named: Iterable[tuple[str, torch.Tensor]], max_bytes: int = BUCKET_BYTES, *, shared: bool = False
) -> Iterator[WeightBucket]:
    """Pack a stream of tensors into buckets of at most ``max_bytes`` and one dtype (a bigger tensor goes alone),
    in order. ``shared``: CPU buffers in shared memory, so handles to them open in another process."""
    pending: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if pending and (size + nbytes > max_bytes or tensor.dtype != pending[0][1].dtype):
            yield _pack(pending, shared)
            pending, size = [], 0
        pending.append((name, tensor))
        size += nbytes
    if pending:
        yield _pack(pending, shared)


def _pack(named: list[tuple[str, torch.Tensor]], shared: bool) -> WeightBucket:
    first = named[0][1]
    flat = torch.empty(sum(t.numel() for _, t in named), dtype=first.dtype, device=first.device)
    if shared and flat.device.type == "cpu":
        retry_shm_manager(flat.share_memory_)
    offset = 0
    for _, tensor in named:
        flat[offset : offset + tensor.numel()].copy_(tensor.reshape(-1))
        offset += tensor.numel()
    return WeightBucket(flat, [n for n, _ in named], [tuple(t.shape) for _, t in named])


class CastView(Mapping):
    """A read-only view of a state dict whose tensors are moved to ``device`` and cast to ``dtype`` (floating
    point only) when read, so a conversion touches one unit's tensors at a time on the target device."""

    def __init__(self, state: Mapping[str, torch.Tensor], device: torch.device, dtype: torch.dtype | None):
        self.state, self.device, self.dtype = state, device, dtype

    def __getitem__(self, key: str) -> torch.Tensor:
        t = self.state[key].detach()
        dtype = self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype
        return t.to(device=self.device, dtype=dtype, non_blocking=True)

    def __iter__(self):
        return iter(self.state)

    def __len__(self) -> int:
        return len(self.state)


# ------------------------------------------------------------------------------------------------ transport
@dataclass
class SyncStats:
    """What one side moved in one sync (for logs and benchmarks/weight_sync_bench.py)."""

    mode: str
    buckets: int = 0
    tensor_bytes: int = 0  # bytes of the weights handed over
    wire_bytes: int = 0  # bytes that crossed a process boundary (handles, or the tensors themselves)


def release_cuda_cache() -> None:
    """This process's cached CUDA memory back to the driver, for an engine on the same GPU: the blocks shared over
    CUDA IPC once every engine has let go of them (``ipc_collect``), then the caching allocator's free blocks;
    nothing without CUDA."""
    if torch.cuda.is_available():
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()


def send_weights(
    worker: Any,
    routes: SyncRoutes,
    header: SyncHeader,
    buckets: Iterable[WeightBucket],
    *,
    actor_group: str,
    rollout_group: str,
) -> SyncStats:
    """Actor side (a threaded RLinf worker): send ``header``, the buckets and ``SYNC_END`` along ``routes``."""
    stats = SyncStats(routes.mode)
    targets = routes.targets_of(worker._rank)
    if not targets:
        return stats
    if routes.mode == "broadcast":
        groups, src = routes.broadcast_groups(actor_group, rollout_group)
        worker.broadcast(header, groups=groups, src=src)
        for bucket in buckets:
            worker.broadcast(bucket, groups=groups, src=src)
            stats.buckets += 1
            stats.tensor_bytes += bucket.nbytes
            stats.wire_bytes += bucket.nbytes * routes.rollout_dp
        worker.broadcast(SYNC_END, groups=groups, src=src)
        return stats
    ((rollout_rank, _slot),) = targets
    worker.send(header, rollout_group, rollout_rank)
    for bucket in buckets:
        message = share_bucket(bucket)
        worker.send(message, rollout_group, rollout_rank)
        stats.buckets += 1
        stats.tensor_bytes += bucket.nbytes
        stats.wire_bytes += message.wire_bytes
        # the engine reads the bucket through its handles: keep it alive until it says it has loaded it. (No
        # second bucket in flight: RLinf's sends wait for the matching recv, so a send racing the rollout's
        # acknowledgement would deadlock.)
        _expect_ack(worker.recv(rollout_group, rollout_rank))
        del bucket, message
    # paired = a collocated engine on this GPU: it maps its KV cache again once SYNC_END is in, so the buckets'
    # memory goes back first
    release_cuda_cache()
    worker.send(SYNC_END, rollout_group, rollout_rank)
    return stats


def _expect_ack(message: Any) -> None:
    if message != SYNC_ACK:
        raise WeightSyncError(f"the rollout answered a weight bucket with {message!r} instead of an acknowledgement")


Load = Callable[[list], Awaitable[None]]


async def receive_weights(
    worker: Any,
    routes: SyncRoutes,
    load: Load,
    *,
    actor_group: str,
    rollout_group: str,
    on_header: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[SyncHeader], SyncStats]:
    """Rollout side (an async RLinf worker): receive what ``send_weights`` sends to this rank and hand every
    bucket to ``load``: a list with one ``HandleBucket`` per TP slot (paired) or one ``WeightBucket``
    (broadcast). ``on_header`` runs once the headers are in, before the first bucket: the actor has finished
    its probe by then (with its weights on the GPU), so a collocated engine takes its memory back only now.
    Returns the headers (one per source, in slot order) and what was received."""
    stats = SyncStats(routes.mode)
    if routes.mode == "broadcast":
        groups, src = routes.broadcast_groups(actor_group, rollout_group)

        async def bcast():
            return await worker.broadcast(None, groups=groups, src=src, async_op=True).async_wait()

        headers = [await bcast()]
        if on_header is not None:
            await on_header()
        while (message := await bcast()) != SYNC_END:
            await load([message])
            stats.buckets += 1
            stats.tensor_bytes += message.nbytes
            stats.wire_bytes += message.nbytes
        return headers, stats
    sources = routes.sources_of(worker._rank)

    async def recv(src: int):
        return await worker.recv(actor_group, src, async_op=True).async_wait()

    headers = [await recv(src) for src in sources]
    if on_header is not None:
        await on_header()
    while True:
        messages = [await recv(src) for src in sources]
        ends = sum(isinstance(m, str) and m == SYNC_END for m in messages)
        if ends == len(messages):
            return headers, stats
        if ends or any(m.names != messages[0].names for m in messages):
            raise WeightSyncError(
                f"the actor ranks {sources} of one engine sent different buckets; their weights (or conversion) differ"
            )
        await load(messages)
        stats.buckets += 1
        stats.tensor_bytes += messages[0].nbytes
        stats.wire_bytes += sum(m.wire_bytes for m in messages)
        for src in sources:
            await worker.send(SYNC_ACK, actor_group, src, async_op=True).async_wait()


# ------------------------------------------------------------------------------------------------ checks
def rollout_dtype(cfg) -> torch.dtype:
    """The dtype the rollout engine holds its weights in, so the actor sends them already cast (half the bytes
    of fp32 master weights for a bf16/fp16 engine): the value of its entry's ``dtype_key`` (``rollout.hf.dtype``
    for the CPU transformers engine, ``rollout.model.precision`` for the others)."""
    name, key = engine_dtype(cfg), engine_spec(cfg).dtype_key
    return dtype_of_precision(name, key) if name in PRECISIONS else dtype_of_hf_name(name, key)


def probe_ids(vocab_size: int, length: int = PROBE_LENGTH, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (1, length), generator=g)


def check_logits_match(expected: torch.Tensor, actual: torch.Tensor, atol: float = DEFAULT_ATOL) -> float:
    """Max absolute logit difference; raises ``WeightSyncError`` above ``atol``."""
    if expected.shape != actual.shape:
        raise WeightSyncError(
            f"probe logits shape {tuple(actual.shape)} != actor's {tuple(expected.shape)} (vocab mismatch?)"
        )
    diff = float((expected.float() - actual.float()).abs().max())
    if not diff <= atol:
        raise WeightSyncError(
            f"rollout logits differ from the actor's by {diff:.3g} (> {atol:g}) after weight sync: the "
            "Megatron->HF mapping or the load is wrong. Check rlinf_ext/convert/mapping.py for this model."
        )
    return diff


class HFWeightLoader:
    """Copies synced buckets into a transformers model in place; ``finish()`` checks every weight arrived (a
    tied ``lm_head`` may be absent)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.own = model.state_dict()
        self.loaded: set[str] = set()

    def load(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        with torch.no_grad():
            for name, tensor in named:
                if name not in self.own:
                    raise WeightSyncError(f"weight sync sent {name!r}, which the rollout model does not have")
                self.own[name].copy_(tensor.to(self.own[name].dtype))
                self.loaded.add(name)

    def finish(self) -> None:
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        missing = [k for k in self.own if k not in self.loaded and not (k == "lm_head.weight" and tied)]
        if missing:
            raise WeightSyncError(
                f"weight sync did not send {len(missing)} weight(s) of the rollout model: {missing[:8]}"
            )
