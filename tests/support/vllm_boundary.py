"""vLLM's engine boundary on CPU, shared by the vLLM tests: vllm 0.32.0's own code wherever it runs without a GPU,
and stand-ins only for what needs one, each checking every call against the installed library's signature
(``inspect.signature(...).bind``). Import after ``pytest.importorskip("vllm")``.

- ``RecordingEngine``: ``AsyncLLM`` (``vllm/v1/engine/async_llm.py``) as the rollout side drives it. Each call is bound
  to the installed ``AsyncLLM`` method; what ``AsyncLLM`` sends to its engine-core process goes through vLLM's
  ``MsgpackEncoder`` exactly as ``core_client.py:_call_utility_async`` encodes a utility call and comes back through
  the engine core's generic ``MsgpackDecoder`` (``EngineCoreWire``); sleep and wake-up follow vLLM's executor (the
  tags asleep, the scheduler paused until fully awake); collective RPCs reach a worker.
- Workers: ``ipc_worker`` is vLLM's own ``Worker`` (its weight-transfer methods; its GPU start-up skipped) over its
  own ``IPCWeightTransferEngine``, loading through vLLM's layerwise reload into a ``LoadableModel``;
  ``NCCLWorker`` stands for the NCCL worker (the group needs GPUs): vLLM's dataclasses parse its payloads.
- ``HostCuda``: the ``torch.cuda`` / ``torch.accelerator`` functions vLLM's transfer calls, on a host without CUDA
  (devices ``GPU-<i>``, a current device per thread, 0 in a new thread as with CUDA; allocator calls logged).
- ``HostIpc``: CUDA IPC of vLLM's packed buffer on host memory. Replaced, and only this: the buffer's allocation on
  ``"cuda"`` (a file-backed shared mapping instead), its export (``reduce_tensor``'s CUDA branch, field for field,
  naming that file as the handle) and its open on the engine side (``rebuild_cuda_tensor``: the file mapped, then
  torch's own tensor rebuild). vLLM's producer, consumer, importer and handle all-gather run as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import vllm.envs as vllm_envs
from torch.multiprocessing import reductions
from torch.overrides import TorchFunctionMode
from vllm.config import VllmConfig
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer import packed_tensor
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerWeightTransferEngine
from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine
from vllm.model_executor.model_loader.reload.layerwise import record_metadata_for_reloading
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.executor.abstract import SLEEP_TAGS
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
from vllm.v1.worker.gpu_worker import Worker
from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin

from tests.support.host_cuda import HostCuda
from tests.support.signature_checks import bind_like, checked_against

WAIT_S = 20.0
REAL_REDUCE_TENSOR = reductions.reduce_tensor
REAL_REBUILD_CUDA_TENSOR = reductions.rebuild_cuda_tensor


# ------------------------------------------------------------------------------------------------ engine-core socket
@contextlib.contextmanager
def vllm_process_env(env: dict[str, str]) -> Iterator[None]:
    """``env`` in ``os.environ``, and vLLM's variables read from it as in a process started with it (an in-process
    engine started earlier in this process cached them: ``EngineCore.__init__`` -> ``enable_envs_cache``); the
    variables and the cache restored on exit."""
    saved = {key: os.environ.get(key) for key in env}
    cached = vllm_envs._is_envs_cache_enabled()
    vllm_envs.disable_envs_cache()
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if cached:
            vllm_envs.enable_envs_cache()


class EngineCoreWire:
    """An ``AsyncLLM``'s socket to its engine-core process: a utility call encoded as
    ``core_client.py:_call_utility_async`` does, ``(client_index, call_id, method, args)`` through vLLM's
    ``MsgpackEncoder``, and decoded by the engine core's generic ``MsgpackDecoder`` (``core.py``,
    ``process_input_sockets``). The encoder refuses what the real socket refuses (vLLM's variables as they are)."""

    def __init__(self):
        self._ids = itertools.count(1)
        self.sent: list[tuple[str, list]] = []

    def call(self, method: str, *args: Any) -> list:
        frames = MsgpackEncoder().encode((0, next(self._ids), method, args))
        _, _, decoded_method, decoded_args = MsgpackDecoder().decode(frames)
        self.sent.append((decoded_method, decoded_args))
        return decoded_args


# ------------------------------------------------------------------------------------------------ AsyncLLM
class RecordingEngine:
    """``AsyncLLM`` for the weight-transfer calls (see the module docstring). ``calls``: ``(method, arguments)`` as
    bound to the installed method; ``log``: shared with ``HostCuda`` for the order across the actor and the engine.
    ``serving``: fully awake and not paused, as vLLM's engine core schedules requests."""

    def __init__(self, worker: Any = None, log: list | None = None):
        self.worker = worker
        self.wire = EngineCoreWire()
        self.calls: list[tuple[str, dict]] = []
        self.log = log if log is not None else []
        self.asleep: set[str] = set()
        self.paused = False
        self.weight_version = "default"  # the engine core's label of its weights (core.py: set_weight_version)

    @property
    def serving(self) -> bool:
        return not self.asleep and not self.paused

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def _enter(self, name: str, args: tuple, kwargs: dict) -> dict:
        arguments = dict(bind_like(getattr(AsyncLLM, name), self, *args, **kwargs).arguments)
        arguments.pop("self")
        self.calls.append((name, arguments))
        self.log.append(("engine", name, arguments))
        return arguments

    async def _rpc(self, method: str, kwargs: dict | None = None) -> Any:
        # AsyncLLM.collective_rpc -> core_client collective_rpc_async: the "collective_rpc" utility call
        method, timeout, args, kwargs = self.wire.call("collective_rpc", method, None, (), kwargs)
        return await asyncio.to_thread(getattr(self.worker, method), *args, **(kwargs or {}))

    async def sleep(self, *args, **kwargs) -> None:
        a = self._enter("sleep", args, kwargs)
        self.wire.call("sleep", a["level"], a["mode"])
        self.paused = True  # core.py EngineCore.sleep: the scheduler pauses first, level >= 1 sleeps the executor
        if a["level"] >= 1:
            self.asleep |= set(SLEEP_TAGS)

    async def wake_up(self, *args, **kwargs) -> bool:
        tags = self._enter("wake_up", args, kwargs)["tags"]
        self.wire.call("wake_up", tags)
        # executor/abstract.py wake_up: nothing unless asleep and every tag given is asleep
        if self.asleep and (tags is None or set(tags) <= self.asleep):
            self.asleep -= set(self.asleep if tags is None else tags)
        fully_awake = not self.asleep
        if fully_awake:  # core.py EngineCore.wake_up: scheduling resumes once fully awake
            self.paused = False
        return fully_awake

    async def pause_generation(self, *args, **kwargs) -> None:
        a = self._enter("pause_generation", args, kwargs)
        self.wire.call("pause_scheduler", a["mode"], a["clear_cache"])
        self.paused = True

    async def resume_generation(self, *args, **kwargs) -> None:
        self._enter("resume_generation", args, kwargs)
        self.wire.call("resume_scheduler")
        if self.asleep:  # vLLM would unpause and schedule onto released memory
            raise AssertionError(f"resume_generation while {sorted(self.asleep)} asleep")
        self.paused = False

    async def reset_prefix_cache(self, *args, **kwargs) -> bool:
        a = self._enter("reset_prefix_cache", args, kwargs)
        self.wire.call("reset_prefix_cache", a["reset_running_requests"], a["reset_connector"])
        return True

    async def reset_encoder_cache(self, *args, **kwargs) -> None:
        self._enter("reset_encoder_cache", args, kwargs)
        self.wire.call("reset_encoder_cache")

    async def init_weight_transfer_engine(self, *args, **kwargs) -> None:
        request = self._enter("init_weight_transfer_engine", args, kwargs)["request"]
        await self._rpc("init_weight_transfer_engine", {"init_info": request.init_info})

    async def start_weight_update(self, *args, **kwargs) -> None:
        self._enter("start_weight_update", args, kwargs)
        await self._rpc("start_weight_update")

    async def update_weights(self, *args, **kwargs) -> None:
        request = self._enter("update_weights", args, kwargs)["request"]
        await self._rpc("update_weights", {"update_info": request.update_info})

    async def finish_weight_update(self, *args, **kwargs) -> None:
        version = self._enter("finish_weight_update", args, kwargs)["weight_version"]
        await self._rpc("finish_weight_update")
        if version is not None:
            self.weight_version = self.wire.call("set_weight_version", version)[0]

    async def update_weight_version(self, *args, **kwargs) -> None:
        version = self._enter("update_weight_version", args, kwargs)["new_version"]
        self.weight_version = self.wire.call("set_weight_version", version)[0]


class ServingEngine(RecordingEngine):
    """``RecordingEngine`` that also generates, modelling what vLLM's engine core does on the GPU (``core.py``, the
    scheduler's pause states) so the rollout worker can serve while a GPU-route sync runs: a request added while the
    scheduler is paused or asleep waits to be scheduled; a running one takes one token per step, each labelled with
    the engine's weight version at that step (``core.py:_attach_weight_version``), and is frozen while paused in
    "keep" mode or asleep; ``pause_generation(mode="wait")`` returns once the running requests have finished ("abort"
    is not modelled). The reply is vLLM's ``RequestOutput`` / ``CompletionOutput`` with vLLM's ``WeightVersionSpan``s
    over the output tokens."""

    STEP_S = 0.002

    def __init__(self, worker: Any = None, log: list | None = None):
        super().__init__(worker, log)
        self.running = 0
        self.pause_mode: str | None = None

    async def pause_generation(self, *args, **kwargs) -> None:
        await super().pause_generation(*args, **kwargs)
        self.pause_mode = self.calls[-1][1]["mode"]
        if self.pause_mode == "abort":
            raise NotImplementedError("ServingEngine models the wait and keep modes")
        while self.pause_mode == "wait" and self.running:
            await asyncio.sleep(self.STEP_S)

    async def resume_generation(self, *args, **kwargs) -> None:
        await super().resume_generation(*args, **kwargs)
        self.pause_mode = None

    def _frozen(self) -> bool:
        return bool(self.asleep) or (self.paused and self.pause_mode != "wait")

    async def generate(self, *args, **kwargs):
        from vllm.outputs import CompletionOutput, RequestOutput, WeightVersionSpan

        a = self._enter("generate", args, kwargs)
        while not self.serving:
            await asyncio.sleep(self.STEP_S)
        self.running += 1
        labels: list[str] = []
        try:
            for _ in range(a["sampling_params"].max_tokens):
                while self._frozen():
                    await asyncio.sleep(self.STEP_S)
                await asyncio.sleep(self.STEP_S)
                labels.append(self.weight_version)
        finally:
            self.running -= 1
        starts = [i for i, label in enumerate(labels) if i == 0 or label != labels[i - 1]]
        spans = [WeightVersionSpan(labels[s], s, e) for s, e in zip(starts, starts[1:] + [len(labels)])]
        prompt = list(a["prompt"]["prompt_token_ids"])
        ids = [10 + (len(prompt) + k) % 50 for k in range(len(labels))]
        yield RequestOutput(
            request_id=a["request_id"],
            prompt=None,
            prompt_token_ids=prompt,
            prompt_logprobs=None,
            outputs=[
                CompletionOutput(
                    index=0,
                    text="",
                    token_ids=ids,
                    cumulative_logprob=None,
                    logprobs=None,
                    finish_reason="length",
                    stop_reason=None,
                    weight_versions=spans,
                )
            ],
            finished=True,
        )


# ------------------------------------------------------------------------------------------------ workers
class LoadableModel(torch.nn.Module):
    """A model as vLLM's loader sees one: parameters under the given (HF) names, ``load_weights`` through each
    parameter's ``weight_loader`` (vLLM's default for plain parameters), returning the names loaded."""

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]):
        super().__init__()
        for name, (shape, dtype) in shapes.items():
            *path, leaf = name.split(".")
            module = self
            for part in path:
                if not hasattr(module, part):
                    module.add_module(part, torch.nn.Module())
                module = getattr(module, part)
            module.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False))

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded


def ipc_worker(model: LoadableModel, device_index: int, *, configured: bool = True) -> Worker:
    """vLLM's ``Worker`` for the weight-transfer calls, made without its GPU start (``init_device``, ``load_model``):
    the state its methods read, its own ``ipc`` engine on ``cuda:<device_index>`` over ``model`` (reload metadata
    recorded as at model load); ``configured=False``: started without ``weight_transfer_config``."""
    worker = object.__new__(Worker)
    worker.vllm_config = VllmConfig()
    worker.rank = 0
    worker._weight_update_active = False
    worker._weight_update_is_draft = False
    runner = LoRAModelRunnerMixin()
    runner.lora_config, runner.get_model = None, lambda: model
    worker.model_runner = runner
    worker.weight_transfer_engine = None
    if configured:
        record_metadata_for_reloading(model)
        worker.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
            WeightTransferConfig(backend="ipc"), worker.vllm_config, torch.device("cuda", device_index), model
        )
    return worker


class NCCLWorker:
    """The ``nccl`` backend's worker without its NCCL group: each call bound to the installed ``Worker`` method,
    the init and update infos parsed by vLLM's own dataclasses; ``update_weights`` meets the trainer's broadcast at
    ``barrier`` (both sides inside one collective, as NCCL) or fails with ``fail_update``."""

    def __init__(self, barrier: threading.Barrier | None = None, fail_update: bool = False):
        self.barrier, self.fail_update = barrier, fail_update
        self.received: list = []

    def init_weight_transfer_engine(self, *args, **kwargs) -> None:
        info = bind_like(Worker.init_weight_transfer_engine, self, *args, **kwargs).arguments["init_info"]
        self.received.append(NCCLWeightTransferEngine.init_info_cls(**info))

    def start_weight_update(self, *args, **kwargs) -> None:
        bind_like(Worker.start_weight_update, self, *args, **kwargs)

    def update_weights(self, *args, **kwargs) -> None:
        info = bind_like(Worker.update_weights, self, *args, **kwargs).arguments["update_info"]
        self.received.append(NCCLWeightTransferEngine.update_info_cls(**info))
        if self.fail_update:
            raise RuntimeError("CUDA error: an illegal memory access")
        if self.barrier is not None:
            self.barrier.wait(WAIT_S)

    def finish_weight_update(self, *args, **kwargs) -> None:
        bind_like(Worker.finish_weight_update, self, *args, **kwargs)


def cuda_ipc_args(tensor: torch.Tensor, *, device: int, handle: bytes) -> tuple:
    """``torch.multiprocessing.reductions.reduce_tensor``'s CUDA branch (the ``rebuild_cuda_tensor`` arguments) for a
    host tensor standing for a CUDA one: the same 15 fields of the same types. Of ``storage._share_cuda_()``'s eight
    values, ``device`` and ``handle`` are given; the storage is the whole allocation (offset 0); the
    reference-counter and event handles are bytes as CUDA's are."""
    storage = tensor._typed_storage()
    return (
        type(tensor),
        tensor.size(),
        tensor.stride(),
        tensor.storage_offset(),
        type(storage),
        tensor.dtype,
        device,
        handle,
        storage.nbytes(),
        0,
        tensor.requires_grad,
        f"/rlinf_ext_ref_{os.getpid()}".encode(),
        0,
        bytes(64),
        True,
    )


class _HostAllocation(TorchFunctionMode):
    def __init__(self, ipc: "HostIpc"):
        super().__init__()
        self.ipc = ipc

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.empty and torch.device(kwargs.get("device") or "cpu").type == "cuda":
            return self.ipc.allocate(*args, dtype=kwargs.get("dtype") or torch.float32)
        return func(*args, **kwargs)


class HostIpc:
    """CUDA IPC on host memory for vLLM's packed buffer (see the module docstring): ``allocation()`` (a torch function
    mode, per thread) turns ``torch.empty(..., device="cuda")`` into a shared file mapping under ``root`` on the
    thread's current device; ``install_producer`` replaces ``packed_tensor.reduce_tensor`` (the export: the CUDA
    tuple naming the file); ``install_consumer`` replaces ``rebuild_cuda_tensor`` (the open: each logged in
    ``opened`` as ``(file, device)``)."""

    def __init__(self, root: Path, cuda: HostCuda):
        self.root, self.cuda = Path(root), cuda
        self.buffers: dict[int, tuple[Path, int]] = {}
        self.opened: list[tuple[str, int]] = []
        self._count = itertools.count()

    def allocation(self) -> TorchFunctionMode:
        return _HostAllocation(self)

    def allocate(self, size: int, *, dtype: torch.dtype) -> torch.Tensor:
        device = self.cuda.device()
        path = self.root / f"gpu{device}-pid{os.getpid()}-{next(self._count)}.buf"
        with open(path, "wb") as f:
            f.truncate(int(size) * dtype.itemsize)
        tensor = torch.from_file(str(path), shared=True, size=int(size), dtype=dtype)
        self.buffers[tensor.untyped_storage().data_ptr()] = (path, device)
        return tensor

    def reduce_tensor(self, tensor: torch.Tensor):
        if tensor.untyped_storage().data_ptr() not in self.buffers:
            return REAL_REDUCE_TENSOR(tensor)
        path, device = self.buffers[tensor.untyped_storage().data_ptr()]
        return REAL_REBUILD_CUDA_TENSOR, cuda_ipc_args(tensor, device=device, handle=str(path).encode())

    def open(
        self,
        tensor_cls,
        tensor_size,
        tensor_stride,
        tensor_offset,
        storage_cls,
        dtype,
        storage_device,
        storage_handle,
        storage_size_bytes,
        storage_offset_bytes,
        requires_grad,
        ref_counter_handle,
        ref_counter_offset,
        event_handle,
        event_sync_required,
    ):
        # what torch's rebuild takes as it is, before its CUDA open (reductions.py: rebuild_cuda_tensor)
        assert isinstance(tensor_cls, type) and issubclass(tensor_cls, torch.Tensor), tensor_cls
        assert isinstance(storage_cls, type) and issubclass(storage_cls, torch.storage.TypedStorage), storage_cls
        assert isinstance(dtype, torch.dtype) and isinstance(storage_device, int), (dtype, storage_device)
        assert all(isinstance(h, bytes) for h in (storage_handle, ref_counter_handle, event_handle))
        assert all(
            isinstance(n, int)
            for n in (
                tensor_offset,
                storage_size_bytes,
                storage_offset_bytes,
                ref_counter_offset,
                *tensor_size,
                *tensor_stride,
            )
        )
        assert isinstance(requires_grad, bool) and isinstance(event_sync_required, bool)
        path = Path(storage_handle.decode())
        self.opened.append((path.name, storage_device))
        mapped = torch.from_file(str(path), shared=True, size=storage_size_bytes, dtype=torch.uint8)
        storage = torch.storage.TypedStorage(wrap_storage=mapped.untyped_storage(), dtype=dtype, _internal=True)
        return torch._utils._rebuild_tensor(storage, tensor_offset, tensor_size, tensor_stride)

    def install_producer(self, set_attribute: Callable[[Any, str, Any], None]) -> None:
        set_attribute(packed_tensor, "reduce_tensor", checked_against(REAL_REDUCE_TENSOR)(self.reduce_tensor))

    def install_consumer(self, set_attribute: Callable[[Any, str, Any], None]) -> None:
        set_attribute(reductions, "rebuild_cuda_tensor", checked_against(REAL_REBUILD_CUDA_TENSOR)(self.open))


class HostIPCTrainer(IPCTrainerWeightTransferEngine):
    """vLLM's IPC trainer engine, its packed send run inside ``ipc.allocation()`` (the buffer's "cuda" allocation is
    the only thing it changes; the mode is per thread, and the send runs in the sync's watchdog thread)."""

    ipc: HostIpc

    def _send_packed(self, source) -> None:
        with self.ipc.allocation():
            return super()._send_packed(source)
