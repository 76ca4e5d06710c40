"""The GPU weight routes through vLLM's own weight-transfer API, on CPU: vLLM 0.32's real trainer engines
(``NCCLTrainerWeightTransferEngine``, ``IPCTrainerWeightTransferEngine``) drive our RLinf client; each rollout rank
answers with the real rollout worker logic (``VLLMRolloutState`` + ``VLLMGpuSync``) over a recording engine. Only
what needs a GPU is replaced: the NCCL broadcast (a barrier the engine's ``update_weights`` must meet at the same
time, as NCCL does) and the IPC engine's CUDA device look-ups. NOT a GPU test: the routes are "written, not
GPU-verified"."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerWeightTransferEngine  # noqa: E402
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload  # noqa: E402
from vllm.distributed.weight_transfer.nccl_engine import (  # noqa: E402
    NCCLTrainerWeightTransferEngine,
)

from transfer_fakes import Done, Op, Pending  # noqa: E402
from rlinf_ext.sync.engine_calls import EngineCall, engine_init_info, run_with_timeout, wait_work  # noqa: E402
from rlinf_ext.sync.vllm_engine_side import VLLMGpuSync  # noqa: E402
from rlinf_ext.sync.vllm_transfer import (  # noqa: E402
    RolloutEngineClient,
    VLLMTransferSender,
    trainer_init_info,
    transfer_backend,
)
from rlinf_ext.sync.weight_sync import SyncHeader, SyncRoutes, WeightSyncError  # noqa: E402
from rlinf_ext.workers.rollout_vllm import VLLMRolloutState  # noqa: E402

pytestmark = pytest.mark.timeout(120)
WAIT_S = 20.0


# ------------------------------------------------------------------------------------------------ pure parts
def cfg_of(placement, backend="vllm", gpus=8):
    return SimpleNamespace(rollout=SimpleNamespace(rollout_backend=backend),
                           cluster=SimpleNamespace(num_nodes=1, num_gpus_per_node=gpus, component_placement=placement))


def test_backend_follows_the_placement_and_the_engine():
    assert transfer_backend(cfg_of({"actor,rollout,reward": "all"}), cuda=True) == "ipc"
    assert transfer_backend(cfg_of({"actor": "0-3", "rollout,reward": "4-7"}), cuda=True) == "nccl"
    assert transfer_backend(cfg_of({"actor,rollout,reward": "all"}), cuda=False) is None  # CPU: in-place reload
    assert transfer_backend(cfg_of({"actor,rollout,reward": "all"}, backend="sglang"), cuda=True) is None
    assert transfer_backend(cfg_of({"rollout,reward": "all"}), cuda=True) is None  # evaluation: no actor


def test_each_engine_gets_its_own_nccl_ranks():
    info = {"master_address": "h", "master_port": 5, "rank_offset": 1, "world_size": 9}
    # 4 engines of TP 2 behind trainer rank 0: workers 1-2, 3-4, 5-6, 7-8
    assert [engine_init_info(info, r, 2)["rank_offset"] for r in range(4)] == [1, 3, 5, 7]
    assert engine_init_info({"packed": True}, 3, 2) == {"packed": True}  # IPC: nothing to offset
    routes = SyncRoutes("broadcast", actor_world=4, rollout_dp=4, rollout_tp=2)
    nccl = trainer_init_info("nccl", routes, rank=0, bucket_bytes=1 << 20, rendezvous=lambda: ("10.0.0.1", 4242))
    assert (nccl.world_size, nccl.master_address, nccl.master_port, nccl.packed, nccl.packed_buffer_size_bytes) == \
        (9, "10.0.0.1", 4242, True, 1 << 20)
    ipc = trainer_init_info("ipc", SyncRoutes("paired", 8, 8), rank=3, bucket_bytes=1 << 20)
    assert ipc.backend == "ipc" and ipc.rank == 3 and not ipc.is_sender and ipc.packed


class NeverDone:
    def done(self):
        return False


def test_every_wait_gives_up_after_its_timeout():
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="rollout rank 1's answer to update_weights did not complete within 0.2 s"):
        wait_work(NeverDone(), 0.2, "rollout rank 1's answer to update_weights")
    with pytest.raises(WeightSyncError, match="the nccl weight transfer did not finish within 0.2 s"):
        run_with_timeout(lambda: time.sleep(30), 0.2, "the nccl weight transfer")
    assert time.monotonic() - t0 < 5
    with pytest.raises(ZeroDivisionError):
        run_with_timeout(lambda: 1 / 0, 5, "x")
    assert run_with_timeout(lambda: 7, 5, "x") == 7


# ------------------------------------------------------------------------------------------------ fakes
class Wire:
    """RLinf's point-to-point messages between actor ranks and rollout ranks, as queues."""

    def __init__(self, actors: int, rollouts: int):
        self.down = {(a, r): queue.Queue() for a in range(actors) for r in range(rollouts)}
        self.up = {(a, r): queue.Queue() for a in range(actors) for r in range(rollouts)}
        self.sent: list[tuple[int, int, object]] = []


class FakeActor:
    def __init__(self, wire: Wire, rank: int):
        self.wire, self._rank = wire, rank

    def send(self, obj, group, dst, async_op=True):
        self.wire.sent.append((self._rank, dst, obj))
        self.wire.down[(self._rank, dst)].put(obj)
        return Done()

    def recv(self, group, src, async_op=True):
        return Pending(self.wire.up[(self._rank, src)])


class FakeRollout(VLLMRolloutState):
    def __init__(self, wire: Wire, rank: int):
        self.wire, self._rank = wire, rank

    def recv(self, group, src, async_op=True):
        return Op(asyncio.to_thread(self.wire.down[(src, self._rank)].get, True, WAIT_S))

    def send(self, obj, group, dst, async_op=True):
        self.wire.up[(dst, self._rank)].put(obj)
        return Op()


class RecordingEngine:
    """``AsyncLLM``'s weight-transfer surface, recording calls; ``update_weights`` meets the trainer's broadcast
    at ``barrier`` (NCCL: both sides inside the same collective) when one is given."""

    def __init__(self, barrier: threading.Barrier | None = None, fail_update: bool = False):
        self.calls: list = []
        self.barrier, self.fail_update = barrier, fail_update

    async def sleep(self, level=1, mode="abort"):
        self.calls.append(("sleep", level, mode))

    async def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    async def pause_generation(self, *, mode="abort", clear_cache=True):
        self.calls.append(("pause_generation", mode))

    async def init_weight_transfer_engine(self, request):
        self.calls.append(("init_weight_transfer_engine", request.init_info))

    async def start_weight_update(self):
        self.calls.append("start_weight_update")

    async def update_weights(self, request):
        self.calls.append(("update_weights", request.update_info))
        if self.fail_update:
            raise RuntimeError("CUDA error: an illegal memory access")
        if self.barrier is not None:
            await asyncio.to_thread(self.barrier.wait, WAIT_S)

    async def finish_weight_update(self, weight_version=None):
        self.calls.append(("finish_weight_update", weight_version))

    async def reset_prefix_cache(self, *args):
        self.calls.append("reset_prefix_cache")

    async def reset_encoder_cache(self):
        self.calls.append("reset_encoder_cache")

    async def resume_generation(self):
        self.calls.append("resume_generation")


CFG = SimpleNamespace(actor=SimpleNamespace(group_name="ActorGroup"), rollout=SimpleNamespace(group_name="RolloutGroup"))


def rollout_side(wire, rank, engine, backend, syncs, errors):
    """One rollout rank: ``syncs`` times the worker's receive side (probe off: no logits in the header)."""
    w = FakeRollout(wire, rank)
    w._setup(CFG, verify_sync=True)
    w.sync_routes = SyncRoutes("broadcast" if backend == "nccl" else "paired", 1, 1)
    w.gpu_sync = VLLMGpuSync(engine, backend, sleep_level=2)

    async def go():
        for _ in range(syncs):
            if backend == "ipc":
                await w.gpu_sync.after_rollout()
            await w._receive_and_load()
        return w

    try:
        return asyncio.run(go())
    except BaseException as exc:
        errors.append(exc)


def start_rollouts(wire, engines, backend, syncs=1):
    errors: list = []
    threads = [threading.Thread(target=rollout_side, args=(wire, r, e, backend, syncs, errors), daemon=True)
               for r, e in enumerate(engines)]
    for t in threads:
        t.start()
    return threads, errors


WEIGHTS = {"model.embed_tokens.weight": torch.arange(12.0).reshape(4, 3),
           "model.layers.0.mlp.up_proj.weight": torch.ones(2, 3, dtype=torch.bfloat16),
           "lm_head.weight": torch.zeros(4, 3)}


def passes():
    return iter((k, v.clone()) for k, v in WEIGHTS.items())


# ------------------------------------------------------------------------------------------------ NCCL route
class CPUNCCLTrainer(NCCLTrainerWeightTransferEngine):
    """vLLM's NCCL trainer engine with its GPU parts replaced: the rendezvous (the client call is vLLM's, with the
    worker init info vLLM builds) and the broadcast (the tensors meet each engine's update_weights at a barrier)."""

    barrier: threading.Barrier
    broadcast: list

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, packed=init_info.packed)
        if engine.is_sender:
            engine.client.init_weight_transfer_engine(worker_init_payload(NCCLWeightTransferInitInfo(
                master_address=init_info.master_address, master_port=init_info.master_port, rank_offset=1,
                world_size=init_info.world_size, packed=init_info.packed)))
        return engine

    def _broadcast(self, source, meta):
        if not self.is_sender:
            for _ in source:
                pass
            return
        self.broadcast.append([name for name, _ in self._checked_iter(source, meta)])  # vLLM's own order check
        self.barrier.wait(WAIT_S)  # the engines are inside update_weights at the same time


def nccl_senders(wire, routes, barrier, broadcast, timeout_s=WAIT_S):
    CPUNCCLTrainer.barrier, CPUNCCLTrainer.broadcast = barrier, broadcast
    return [VLLMTransferSender(FakeActor(wire, rank), "nccl", routes, rollout_group="RolloutGroup",
                               timeout_s=timeout_s, trainer_init=CPUNCCLTrainer.trainer_init,
                               rendezvous=lambda: ("10.0.0.1", 4242)) for rank in range(routes.actor_world)]


def run_actor_ranks(senders, version):
    """Every actor rank's sync at once (threads), as the runner calls the whole group."""
    errors: list = []

    def one(sender):
        try:
            sender.sync(SyncHeader(version=version, sender=sender.rank), passes)
        except BaseException as exc:
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in senders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    return errors


def test_nccl_route_call_order_on_both_sides():
    routes = SyncRoutes("broadcast", actor_world=2, rollout_dp=2, rollout_tp=2)
    wire, broadcast = Wire(2, 2), []
    engines = [RecordingEngine(threading.Barrier(3)), None]
    engines[1] = RecordingEngine(engines[0].barrier)
    threads, rollout_errors = start_rollouts(wire, engines, "nccl", syncs=2)
    senders = nccl_senders(wire, routes, engines[0].barrier, broadcast)
    assert run_actor_ranks(senders, version=5) == []
    assert run_actor_ranks(senders, version=6) == []
    for t in threads:
        t.join(WAIT_S)
    assert rollout_errors == []

    meta = {"names": list(WEIGHTS), "dtype_names": ["float32", "bfloat16", "float32"],
            "shapes": [[4, 3], [2, 3], [4, 3]]}
    for rank, engine in enumerate(engines):
        (method, init), *rest = engine.calls
        # vLLM's worker init info: the rendezvous, 1 trainer + 2 engines x TP 2, this engine's first rank
        assert method == "init_weight_transfer_engine" and init["rank_offset"] == 1 + 2 * rank
        assert (init["master_address"], init["master_port"], init["world_size"], init["packed"]) == \
            ("10.0.0.1", 4242, 5, True)
        one_sync = [("pause_generation", "wait"), "start_weight_update", ("update_weights", meta),
                    ("finish_weight_update", "{v}"), "reset_prefix_cache", "reset_encoder_cache", "resume_generation"]
        expect = [c if c != ("finish_weight_update", "{v}") else ("finish_weight_update", v)
                  for v in ("5", "6") for c in one_sync]
        assert rest == expect  # init once; no sleep: the engine owns its GPUs
    assert broadcast == [list(WEIGHTS)] * 2  # rank 0 broadcast everything, in metadata order, once per sync
    # only actor rank 0 talks to the rollout ranks; the other rank holds the same weights and sends nothing
    assert {src for src, _, _ in wire.sent} == {0}
    assert [type(m).__name__ for src, dst, m in wire.sent if dst == 1][:3] == ["SyncHeader", "EngineCall", "EngineCall"]


@pytest.mark.slow
def test_a_refused_update_reaches_the_actor_and_the_engine_serves_again():
    routes = SyncRoutes("broadcast", actor_world=1, rollout_dp=1)
    wire = Wire(1, 1)
    engine = RecordingEngine(fail_update=True)
    threads, rollout_errors = start_rollouts(wire, [engine], "nccl")
    # the trainer's broadcast has no peer (the engine failed before it): the actor's wait ends with the timeout
    # or with the engine's error, whichever comes first; either names the failure
    errors = run_actor_ranks(nccl_senders(wire, routes, threading.Barrier(2), [], timeout_s=3.0), version=1)
    threads[0].join(WAIT_S)
    assert len(errors) == 1 and isinstance(errors[0], WeightSyncError)
    assert "illegal memory access" in str(errors[0]) or "did not finish within 3 s" in str(errors[0])
    assert rollout_errors and "illegal memory access" in str(rollout_errors[0])
    assert engine.calls[-3:] == ["reset_prefix_cache", "reset_encoder_cache", "resume_generation"]  # serving again


def test_an_engine_that_never_answers_times_out():
    routes = SyncRoutes("broadcast", actor_world=1, rollout_dp=1)
    client = RolloutEngineClient(FakeActor(Wire(1, 1), 0), "RolloutGroup", routes, timeout_s=0.3)
    with pytest.raises(WeightSyncError, match="rollout rank 0's answer to start_weight_update did not complete"):
        client.start_weight_update()


# ------------------------------------------------------------------------------------------------ IPC route
class CPUIPCTrainer(IPCTrainerWeightTransferEngine):
    """vLLM's IPC trainer engine without its CUDA look-ups (device index, GPU UUID, ``ipc_collect``); the
    handles are ``reduce_tensor``'s of CPU tensors."""

    def __init__(self, *, client, source, is_sender=True, packed=False, packed_buffer_size_bytes=1 << 30):
        super(IPCTrainerWeightTransferEngine, self).__init__(client=client, source=source, is_sender=is_sender)
        self.packed, self.packed_buffer_size_bytes = packed, packed_buffer_size_bytes
        self.device_index, self.gpu_uuid = 0, "GPU-0"

    @staticmethod
    def _post_send_sync():
        pass


def test_ipc_route_call_order_with_sleep_and_wake_up():
    routes = SyncRoutes("paired", actor_world=1, rollout_dp=1)
    wire = Wire(1, 1)
    engine = RecordingEngine()
    threads, rollout_errors = start_rollouts(wire, [engine], "ipc", syncs=2)

    def trainer_init(info, *, client, source):
        info.packed = False  # the packed producer allocates a CUDA buffer
        return CPUIPCTrainer.trainer_init(info, client=client, source=source)

    sender = VLLMTransferSender(FakeActor(wire, 0), "ipc", routes, rollout_group="RolloutGroup", timeout_s=WAIT_S,
                                trainer_init=trainer_init)
    assert run_actor_ranks([sender], version=1) == [] and run_actor_ranks([sender], version=2) == []
    threads[0].join(WAIT_S)
    assert rollout_errors == []
    calls = [c[0] if isinstance(c, tuple) and c[0] == "update_weights" else c for c in engine.calls]
    one_sync = [("sleep", 2, "wait"),  # after the rollout, requests in flight finish first (vLLM #28714)
                ("wake_up", ["weights"]), "start_weight_update", "update_weights", ("finish_weight_update", "{v}"),
                ("wake_up", ["kv_cache"]), "reset_prefix_cache", "reset_encoder_cache", "resume_generation"]
    expect = [("init_weight_transfer_engine", {"packed": False})]
    for v in ("1", "2"):
        expect += [c if c != ("finish_weight_update", "{v}") else ("finish_weight_update", v) for c in one_sync]
    # init comes once, with the first sync, after the engine went to sleep
    assert calls == expect[1:2] + expect[:1] + expect[2:]
    update = next(c[1] for c in engine.calls if isinstance(c, tuple) and c[0] == "update_weights")
    assert update["names"] == list(WEIGHTS) and all(set(h) == {"GPU-0"} for h in update["ipc_handles"])


def test_sleep_level_and_no_sleep_while_generating():
    engine = RecordingEngine()
    sync = VLLMGpuSync(engine, "ipc", sleep_level=1)
    asyncio.run(sync.after_rollout())
    asyncio.run(sync.after_rollout())  # already asleep: not twice
    assert engine.calls == [("sleep", 1, "wait")]  # "wait": in-flight requests finish; vLLM's default aborts
    nccl = VLLMGpuSync(engine, "nccl")
    asyncio.run(nccl.after_rollout())
    assert engine.calls == [("sleep", 1, "wait")]  # a disaggregated engine never sleeps
    with pytest.raises(RuntimeError, match="before start_weight_update"):
        asyncio.run(nccl.handle(EngineCall("update_weights", {})))
