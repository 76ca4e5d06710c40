"""The FSDP2 actor on the collocated vLLM route (``ipc``), two gloo ranks: ``ActorWorker._sync_through_engine``
hands its weight passes to vLLM 0.32's own IPC trainer engine, which iterates them on EVERY rank and all-gathers
the per-tensor handles over the default group; rank 0 ships them. Each rank must therefore stream the whole model,
in the same order, and every merged handle must name every rank's GPU (each engine opens its own GPU's).

Stand-ins, for what needs a GPU only: the trainer's GPU look-ups (device index, UUID: ``GPU-<rank>`` here),
``torch.cuda.synchronize``/``ipc_collect`` (no CUDA work to wait for), the unpacked mode (the packed producer's
buffer is a CUDA allocation); the control plane to the engines is a recorder bound to vLLM's
``VLLMWeightSyncClient`` signatures. Everything else (iteration, ``reduce_tensor``, the all-gather, the merge) is
vLLM's code on gloo."""

from __future__ import annotations

import inspect
import os
import socket

import pytest
import torch

from tests.support.spawn_ranks import spawn_ranks

pytest.importorskip("vllm")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


class RecordingClient:
    """vLLM's ``VLLMWeightSyncClient`` (the four control calls to the engines): each call is bound to the
    protocol's signature, then recorded."""

    def __init__(self):
        self.calls: list[tuple[str, tuple, dict]] = []

    def _record(self, method: str, *args, **kwargs) -> None:
        from vllm.distributed.weight_transfer.base import VLLMWeightSyncClient

        inspect.signature(getattr(VLLMWeightSyncClient, method)).bind(self, *args, **kwargs)
        self.calls.append((method, args, kwargs))

    def init_weight_transfer_engine(self, init_info):
        self._record("init_weight_transfer_engine", init_info)

    def start_weight_update(self):
        self._record("start_weight_update")

    def update_weights(self, update_info):
        self._record("update_weights", update_info)

    def finish_weight_update(self, weight_version=None):
        self._record("finish_weight_update", weight_version)


class IPCEngineSender:
    """What ``_sync_through_engine`` uses of ``sync/vllm_transfer.py:VLLMTransferSender`` (``backend``, ``sync``):
    vLLM's IPC trainer engine over ``HFWeightSource(passes)``, made from rlinf_ext's trainer init info."""

    backend = "ipc"

    def __init__(self, rank: int, world: int):
        self.rank, self.world, self.client = rank, world, RecordingClient()

    def sync(self, header, passes) -> None:
        from vllm.distributed.weight_transfer.base import TrainerWeightTransferEngine
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerWeightTransferEngine

        from rlinf_ext.sync.vllm_transfer import HFWeightSource, trainer_init_info
        from rlinf_ext.sync.weight_sync import SyncRoutes

        class CPUIPCTrainer(IPCTrainerWeightTransferEngine):  # its __init__ without the GPU look-ups
            def __init__(self, *, client, source, is_sender, packed, packed_buffer_size_bytes):
                TrainerWeightTransferEngine.__init__(self, client=client, source=source, is_sender=is_sender)
                self.packed, self.packed_buffer_size_bytes = packed, packed_buffer_size_bytes
                self.device_index, self.gpu_uuid = 0, f"GPU-{torch.distributed.get_rank()}"

        info = trainer_init_info("ipc", SyncRoutes("paired", self.world, self.world), self.rank)
        info.packed = False  # the packed producer allocates its buffer on CUDA
        CPUIPCTrainer.trainer_init(info, client=self.client, source=HFWeightSource(passes)).send_weights()


def ipc_rank(rank: int, world: int, port: int, cfg, out: str) -> None:
    from rlinf_ext.training.fsdp_policy import FSDPPolicy
    from rlinf_ext.training.settings import ActorSettings
    from rlinf_ext.workers.actor import ActorWorker
    from tests.support.gloo_dp import init_gloo_dp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    torch.cuda.synchronize = lambda *a, **k: None  # vLLM's trainer waits on CUDA work; there is none here
    torch.cuda.ipc_collect = lambda: None
    dp = init_gloo_dp()
    worker = ActorWorker.__new__(ActorWorker)  # the worker's sync methods, without RLinf's Worker around them
    worker.cfg, worker._rank = cfg, rank
    worker.policy = FSDPPolicy(cfg.rollout.model.model_path, ActorSettings.from_config(cfg, 1), dp=dp)
    worker._engine_sender = IPCEngineSender(rank, world)
    result = worker._sync_through_engine(verify=False)
    full = worker.policy.hf_state_dict(torch.bfloat16)  # collective; rank 0 alone gets it
    torch.save({"result": result, "calls": worker._engine_sender.client.calls, "full": full}, f"{out}.rank{rank}")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_fsdp2_rank_streams_the_whole_model_into_vllms_ipc_trainer(tiny_mm_assets, tmp_path):
    from rlinf_ext.config.loader import load_config

    mm = tiny_mm_assets.mm
    overrides = {
        "paths.tiny_assets": tiny_mm_assets.root,
        "rollout.model.model_path": mm.qwen2_5_vl_tiny,
        "cluster.component_placement": "{actor: 0-1, rollout: 0-1, reward: 0}",
        "rollout.model.precision": "bf16",  # the weights are cast before they are gathered
        "retrieval.launch": "false",
        "tools.search.server_addr": "127.0.0.1:1",
    }
    cfg = load_config("tiny-mm-cpu", [f"{k}={v}" for k, v in overrides.items()])
    out = tmp_path / "ipc"
    spawn_ranks(ipc_rank, args=(2, _free_port(), cfg, str(out)), nprocs=2)
    ranks = [torch.load(f"{out}.rank{r}", weights_only=False) for r in range(2)]
    full = ranks[0]["full"]
    assert ranks[1]["full"] == {} and len(full) > 50  # torch's full state dict reaches rank 0 only
    assert [r["result"] for r in ranks] == [{"mode": "ipc", "version": 0}] * 2
    assert ranks[1]["calls"] == []  # only the sender talks to the engines
    calls = ranks[0]["calls"]
    assert [c[0] for c in calls] == [
        "init_weight_transfer_engine",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
    ]
    info = calls[2][1][0]
    assert info["names"] == list(full)  # every weight, in the state dict's order
    assert info["shapes"] == [list(t.shape) for t in full.values()]
    assert info["dtype_names"] == [str(t.dtype).removeprefix("torch.") for t in full.values()]
    assert all(set(handles) == {"GPU-0", "GPU-1"} for handles in info["ipc_handles"])  # each engine finds its own
