"""The GPU engine's start and the ``ipc`` backend's first update, on CPU up to the CUDA calls: ``start_engine`` builds
vLLM's real ``AsyncEngineArgs`` and sets the process environment before ``AsyncLLM.from_engine_args`` (replaced: the
engine core needs a GPU; the environment is captured there, as its engine-core process would inherit it). Under
that environment, the update info vLLM's IPC trainer ships (``asdict(IPCWeightTransferUpdateInfo(...))`` around
``reduce_tensor``'s CUDA tuple) crosses vLLM's engine-core serialization as ``AsyncLLM.update_weights`` sends it,
and vLLM's own worker takes it: its IPC engine, packed consumer and layerwise reload (``tests/support/vllm_boundary.py``)."""

from __future__ import annotations

import os
from dataclasses import asdict

import pytest
import torch

pytest.importorskip("vllm")

from vllm import AsyncEngineArgs  # noqa: E402
from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo  # noqa: E402
from vllm.utils.import_utils import resolve_obj_by_qualname  # noqa: E402
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: E402

from rlinf_ext.generation.vllm_engine import START_ENGINE, WeightLoadExtension, start_engine  # noqa: E402
from rlinf_ext.generation.vllm_wire import (  # noqa: E402
    ALLOW_PICKLED_CALLS_ENV,
    WORKER_EXTENSION,
    VLLMEngineOptions,
    engine_environment,
)
from tests.support.host_cuda import HostCuda  # noqa: E402
from tests.support.signature_checks import bind_like  # noqa: E402
from tests.support.vllm_boundary import (  # noqa: E402
    REAL_REBUILD_CUDA_TENSOR,
    EngineCoreWire,
    HostIpc,
    LoadableModel,
    ipc_worker,
    vllm_process_env,
)

CHUNK = {
    "model.embed_tokens.weight": torch.arange(12.0).reshape(4, 3),
    "model.layers.0.mlp.up_proj.weight": torch.full((2, 3), 0.5, dtype=torch.bfloat16),
}


def start_captured(monkeypatch, backend) -> dict:
    """``start_engine`` of a GPU engine with ``backend``; returns the process environment and the engine arguments
    ``AsyncLLM.from_engine_args`` got."""
    monkeypatch.delenv(ALLOW_PICKLED_CALLS_ENV, raising=False)  # restored after the test
    started: dict = {}
    real = AsyncLLM.from_engine_args

    def from_engine_args(cls, *args, **kwargs):
        call = bind_like(real, *args, **kwargs).arguments
        assert isinstance(call["engine_args"], AsyncEngineArgs)
        started.update(env=dict(os.environ), engine_args=call["engine_args"])
        return object()

    monkeypatch.setattr(AsyncLLM, "from_engine_args", classmethod(from_engine_args))
    parts: dict = {}
    start_engine(
        VLLMEngineOptions(
            model_path="unused", in_process=False, enable_sleep_mode=backend == "ipc", weight_transfer_backend=backend
        ),
        parts,
    )
    assert START_ENGINE in parts
    return started


def ipc_update_info(ipc: HostIpc) -> dict:
    """One packed chunk as vLLM's IPC trainer ships it (ipc_engine.py ``_do_send``): ``reduce_tensor``'s CUDA tuple
    of the buffer under the GPU's UUID."""
    flat = [t.contiguous().view(-1).view(torch.uint8) for t in CHUNK.values()]
    buffer = ipc.allocate(64, dtype=torch.uint8)
    buffer[: sum(f.numel() for f in flat)].copy_(torch.cat(flat))
    _, args = ipc.reduce_tensor(buffer)
    bind_like(REAL_REBUILD_CUDA_TENSOR, *args)  # the 15 arguments of torch's rebuild
    assert (type(args[0]), type(args[1]), args[4], type(args[5]), type(args[7])) == (
        type(torch.Tensor),
        torch.Size,
        torch.storage.TypedStorage,
        torch.dtype,
        bytes,
    )
    return asdict(
        IPCWeightTransferUpdateInfo(
            names=list(CHUNK),
            dtype_names=[str(t.dtype).split(".")[-1] for t in CHUNK.values()],
            shapes=[list(t.shape) for t in CHUNK.values()],
            ipc_handles={"GPU-0": args},
            tensor_sizes=[f.numel() for f in flat],
        )
    )


def test_ipc_update_info_crosses_the_engine_core_socket_of_a_started_engine(monkeypatch, tmp_path):
    started = start_captured(monkeypatch, "ipc")
    assert started["engine_args"].weight_transfer_config.backend == "ipc"  # vLLM took the dict
    cuda = HostCuda()
    cuda.install(monkeypatch.setattr)
    ipc = HostIpc(tmp_path, cuda)
    ipc.install_consumer(monkeypatch.setattr)
    info = ipc_update_info(ipc)
    # AsyncLLM.update_weights -> collective_rpc("update_weights", kwargs={"update_info": ...}) -> the socket
    with vllm_process_env({ALLOW_PICKLED_CALLS_ENV: "0"}), pytest.raises(TypeError, match="is not serializable"):
        EngineCoreWire().call("collective_rpc", "update_weights", None, (), {"update_info": info})
    with vllm_process_env({ALLOW_PICKLED_CALLS_ENV: started["env"].get(ALLOW_PICKLED_CALLS_ENV, "0")}):
        wire = EngineCoreWire()
        wire.call("collective_rpc", "init_weight_transfer_engine", None, (), {"init_info": {"packed": True}})
        method, _, _, kwargs = wire.call("collective_rpc", "update_weights", None, (), {"update_info": info})
    decoded = kwargs["update_info"]["ipc_handles"]["GPU-0"]
    assert [type(a) for a in decoded] == [
        type(a) if not isinstance(a, tuple) else list for a in info["ipc_handles"]["GPU-0"]
    ]  # tuples (torch.Size too) come back as lists

    model = LoadableModel({k: (tuple(t.shape), t.dtype) for k, t in CHUNK.items()})
    worker = ipc_worker(model, device_index=0)
    worker.init_weight_transfer_engine({"packed": True})
    worker.start_weight_update()
    getattr(worker, method)(**kwargs)  # vLLM's Worker.update_weights, down to the (host) IPC open
    worker.finish_weight_update()
    assert ipc.opened == [(ipc.buffers[next(iter(ipc.buffers))][0].name, 0)]
    state = dict(model.named_parameters())
    assert all(torch.equal(state[k], t) for k, t in CHUNK.items())


def test_only_the_ipc_engine_allows_pickled_calls(monkeypatch):
    assert engine_environment(VLLMEngineOptions(model_path="m", weight_transfer_backend="ipc")) == {
        ALLOW_PICKLED_CALLS_ENV: "1"
    }
    assert engine_environment(VLLMEngineOptions(model_path="m", weight_transfer_backend="nccl")) == {}
    assert engine_environment(VLLMEngineOptions(model_path="m")) == {}
    assert ALLOW_PICKLED_CALLS_ENV not in start_captured(monkeypatch, "nccl")["env"]


def test_the_worker_extension_resolves_as_vllm_resolves_it():
    assert resolve_obj_by_qualname(WORKER_EXTENSION) is WeightLoadExtension
