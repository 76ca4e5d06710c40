"""The GPU weight routes through vLLM's own weight-transfer API, on CPU: vLLM 0.32's real trainer engines drive our
RLinf client; each rollout rank answers with the real rollout worker logic (``VLLMRolloutState`` + ``VLLMGpuSync``)
over ``tests/support/vllm_boundary.py``'s ``RecordingEngine``: every call bound to the installed ``AsyncLLM``, every call to
the engine core through vLLM's msgpack serialization under the environment the engine start sets; on the IPC route
the engine side is vLLM's own ``Worker``, IPC engine, packed consumer and layerwise reload. Only what needs a GPU is
replaced: the NCCL broadcast (a barrier the engine's ``update_weights`` must meet at the same time, as NCCL does),
``torch.cuda``'s device functions (``HostCuda``) and the CUDA IPC of the packed buffer (``HostIpc``: allocation,
export, open). NOT a GPU test: the routes are "written, not GPU-verified"."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import threading
import time
import traceback
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from rlinf.scheduler import Worker as RLinfWorker  # noqa: E402
from transfer_fakes import Done, Op, Pending  # noqa: E402
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload  # noqa: E402
from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine  # noqa: E402

from rlinf_ext.generation.vllm_wire import VLLMEngineOptions, engine_environment  # noqa: E402
from rlinf_ext.sync.engine_calls import (  # noqa: E402
    EngineCall,
    engine_init_info,
    run_with_timeout,
    wait_async,
    wait_work,
)
from rlinf_ext.sync.vllm_engine_side import VLLMGpuSync  # noqa: E402
from rlinf_ext.sync.vllm_transfer import (  # noqa: E402
    RolloutEngineClient,
    VLLMTransferSender,
    ipc_buffer_bytes,
    trainer_init_info,
    transfer_backend,
)
from rlinf_ext.sync.weight_sync import SyncHeader, SyncRoutes, WeightSyncError  # noqa: E402
from rlinf_ext.workers.rollout_vllm import VLLMRolloutState  # noqa: E402
from tests.support.host_cuda import HostCuda  # noqa: E402
from tests.support.signature_checks import bind_like  # noqa: E402
from tests.support.vllm_boundary import (  # noqa: E402
    WAIT_S,
    HostIpc,
    HostIPCTrainer,
    LoadableModel,
    NCCLWorker,
    RecordingEngine,
    ServingEngine,
    ipc_worker,
    vllm_process_env,
)

pytestmark = pytest.mark.timeout(120)
# the environment each backend's AsyncLLM starts with (generation/vllm_wire.py; start_engine sets it)
ENGINE_ENV = {
    backend: engine_environment(VLLMEngineOptions(model_path="m", in_process=False, weight_transfer_backend=backend))
    for backend in ("ipc", "nccl")
}


# ------------------------------------------------------------------------------------------------ pure parts
def cfg_of(placement, backend="vllm", gpus=8):
    return SimpleNamespace(
        rollout=SimpleNamespace(rollout_backend=backend),
        cluster=SimpleNamespace(num_nodes=1, num_gpus_per_node=gpus, component_placement=placement),
    )


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
    assert (nccl.world_size, nccl.master_address, nccl.master_port, nccl.packed, nccl.packed_buffer_size_bytes) == (
        9,
        "10.0.0.1",
        4242,
        True,
        1 << 20,
    )
    ipc = trainer_init_info("ipc", SyncRoutes("paired", 8, 8), rank=3, bucket_bytes=1 << 20)
    assert ipc.backend == "ipc" and ipc.rank == 3 and not ipc.is_sender and ipc.packed


class NeverDone:
    def done(self):
        return False


def test_every_wait_gives_up_after_its_timeout():
    t0 = time.monotonic()
    with pytest.raises(
        WeightSyncError, match="rollout rank 1's answer to update_weights did not complete within 0.2 s"
    ):
        wait_work(NeverDone(), 0.2, "rollout rank 1's answer to update_weights")
    with pytest.raises(WeightSyncError, match="the nccl weight transfer did not finish within 0.2 s"):
        run_with_timeout(lambda: time.sleep(30), 0.2, "the nccl weight transfer")
    assert time.monotonic() - t0 < 5
    with pytest.raises(ZeroDivisionError):
        run_with_timeout(lambda: 1 / 0, 5, "x")
    assert run_with_timeout(lambda: 7, 5, "x") == 7


def test_an_async_wait_gives_up_after_its_timeout_naming_what_was_stuck_then():
    async def go():
        stuck = ["nothing yet"]

        async def hang():
            stuck[0] = "request k1"
            await asyncio.sleep(30)

        with pytest.raises(WeightSyncError, match=r"^rank 2: the pause did not finish within 0.05 s: request k1$"):
            await wait_async(hang(), 0.05, "rank 2: the pause", stuck=lambda: stuck[0])

        async def own_timeout():
            raise TimeoutError("the engine's socket")

        with pytest.raises(TimeoutError, match="the engine's socket"):  # not this wait's: passed on as it is
            await wait_async(own_timeout(), 5, "x")
        return await wait_async(asyncio.sleep(0, result=7), 5, "x")

    assert asyncio.run(go()) == 7


def test_the_watchdog_thread_runs_on_the_callers_cuda_device(monkeypatch):
    """vLLM's trainer engines read the current device in the watchdog thread (the IPC buffer, the GPU UUID):
    it must be the caller's, not a new thread's device 0."""
    cuda = HostCuda()
    cuda.install(monkeypatch.setattr)
    seen: list[int] = []
    fresh = threading.Thread(target=lambda: seen.append(torch.cuda.current_device()))
    torch.cuda.set_device(3)
    fresh.start()
    fresh.join()
    assert seen == [0]  # CUDA's rule for a new thread, kept by the stand-in
    assert run_with_timeout(torch.cuda.current_device, 5, "x") == 3
    assert run_with_timeout(torch.accelerator.current_device_index, 5, "x") == 3
    assert torch.cuda.current_device() == 3


# ------------------------------------------------------------------------------------------------ RLinf stand-ins
class Wire:
    """RLinf's point-to-point messages between actor ranks and rollout ranks, as queues (``make_queue``: of
    another process's context for actor ranks in processes of their own)."""

    def __init__(self, actors: int, rollouts: int, make_queue=queue.Queue):
        self.down = {(a, r): make_queue() for a in range(actors) for r in range(rollouts)}
        self.up = {(a, r): make_queue() for a in range(actors) for r in range(rollouts)}
        self.sent: list[tuple[int, int, object]] = []


class FakeActor:
    """An actor rank's RLinf ``Worker.send``/``recv`` (calls bound to the installed methods)."""

    def __init__(self, wire: Wire, rank: int):
        self.wire, self._rank = wire, rank

    def send(self, obj, group, dst, async_op=True):
        bind_like(RLinfWorker.send, self, obj, group, dst, async_op=async_op)
        self.wire.sent.append((self._rank, dst, obj))
        self.wire.down[(self._rank, dst)].put(obj)
        return Done()

    def recv(self, group, src, async_op=True):
        bind_like(RLinfWorker.recv, self, group, src, async_op=async_op)
        return Pending(self.wire.up[(self._rank, src)])


class FakeRollout(VLLMRolloutState):
    def __init__(self, wire: Wire, rank: int):
        self.wire, self._rank = wire, rank

    def recv(self, group, src, async_op=True):
        bind_like(RLinfWorker.recv, self, group, src, async_op=async_op)
        return Op(asyncio.to_thread(self.wire.down[(src, self._rank)].get, True, WAIT_S))

    def send(self, obj, group, dst, async_op=True):
        bind_like(RLinfWorker.send, self, obj, group, dst, async_op=async_op)
        self.wire.up[(dst, self._rank)].put(obj)
        return Op()


CFG = SimpleNamespace(
    actor=SimpleNamespace(group_name="ActorGroup"),  # a GPU engine's dtype: bf16
    rollout=SimpleNamespace(group_name="RolloutGroup", model=SimpleNamespace(precision="bf16")),
    runner=SimpleNamespace(partial_rollout=False),
)


def rollout_side(wire, rank, engine, backend, syncs, errors, versions=None):
    """One rollout rank: ``syncs`` times the worker's receive side (probe off: no logits in the header), with the
    process environment its engine starts with; ``versions``: the driver's version of each sync (None: counted)."""
    w = FakeRollout(wire, rank)
    w._setup(CFG, verify_sync=True)
    w.sync_routes = SyncRoutes("broadcast" if backend == "nccl" else "paired", 1, 1)
    w.gpu_sync = VLLMGpuSync(engine, backend, sleep_level=2)

    async def go():
        for k in range(syncs):
            if backend == "ipc":
                await w.gpu_sync.after_rollout()
            await w._receive_and_load(None if versions is None else versions[k])
        return w

    try:
        return asyncio.run(go())
    except BaseException as exc:
        errors.append(exc)


def start_rollouts(wire, engines, backend, syncs=1, versions=None):
    errors: list = []
    threads = [
        threading.Thread(target=rollout_side, args=(wire, r, e, backend, syncs, errors, versions), daemon=True)
        for r, e in enumerate(engines)
    ]
    for t in threads:
        t.start()
    return threads, errors


WEIGHTS = {
    "model.embed_tokens.weight": torch.arange(12.0).reshape(4, 3),
    "model.layers.0.mlp.up_proj.weight": torch.ones(2, 3, dtype=torch.bfloat16),
    "lm_head.weight": torch.zeros(4, 3),
}
# packed buffers of 64 bytes: the embedding and the MLP weight (48 + 12 bytes) in one chunk, the head in a second
SMALL_BUFFER = 64


def weights_of(rank: int, version: int, base: dict = WEIGHTS) -> dict[str, torch.Tensor]:
    """Every actor rank's weights of one version, distinct per rank: an engine shows whose buffer it opened."""
    return {k: (v.float() * version + 100 * rank).to(v.dtype) for k, v in base.items()}


def passes():
    return iter((k, v.clone()) for k, v in WEIGHTS.items())


def model_state(engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.worker.model_runner.get_model().named_parameters()}


def loadable_model(base: dict = WEIGHTS) -> LoadableModel:
    return LoadableModel({k: (tuple(v.shape), v.dtype) for k, v in base.items()})


def run_actor_ranks(senders, version, passes_of=lambda rank: passes, device_of=lambda rank: None):
    """Every actor rank's sync at once (threads, each on its rank's CUDA device when given), as the runner calls
    the whole group."""
    errors: list = []

    def one(sender):
        try:
            if device_of(sender.rank) is not None:
                torch.cuda.set_device(device_of(sender.rank))
            sender.sync(SyncHeader(version=version, sender=sender.rank), passes_of(sender.rank))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in senders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    return errors


def versioned(version, base: dict = WEIGHTS):
    """``passes_of`` for ``run_actor_ranks``: each rank's ``weights_of`` that version."""
    return lambda rank: lambda: iter(weights_of(rank, version, base).items())


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
            engine.client.init_weight_transfer_engine(
                worker_init_payload(
                    NCCLWeightTransferInitInfo(
                        master_address=init_info.master_address,
                        master_port=init_info.master_port,
                        rank_offset=1,
                        world_size=init_info.world_size,
                        packed=init_info.packed,
                    )
                )
            )
        return engine

    def _broadcast(self, source, meta):
        if not self.is_sender:
            for _ in source:
                pass
            return
        self.broadcast.append([name for name, _ in self._checked_iter(source, meta)])  # vLLM's own order check
        self.barrier.wait(WAIT_S)  # the engines are inside update_weights at the same time


def test_cpu_nccl_trainer_keeps_vllms_signatures():
    import inspect

    def parameters(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    for name in ("trainer_init", "_broadcast"):  # what it overrides is called as vLLM calls its own
        assert parameters(getattr(CPUNCCLTrainer, name)) == parameters(getattr(NCCLTrainerWeightTransferEngine, name))


def nccl_senders(wire, routes, barrier, broadcast, timeout_s=WAIT_S):
    CPUNCCLTrainer.barrier, CPUNCCLTrainer.broadcast = barrier, broadcast
    return [
        VLLMTransferSender(
            FakeActor(wire, rank),
            "nccl",
            routes,
            rollout_group="RolloutGroup",
            timeout_s=timeout_s,
            trainer_init=CPUNCCLTrainer.trainer_init,
            rendezvous=lambda: ("10.0.0.1", 4242),
        )
        for rank in range(routes.actor_world)
    ]


def test_nccl_route_call_order_on_both_sides():
    routes = SyncRoutes("broadcast", actor_world=2, rollout_dp=2, rollout_tp=2)
    wire, broadcast, barrier = Wire(2, 2), [], threading.Barrier(3)
    engines = [RecordingEngine(NCCLWorker(barrier)), RecordingEngine(NCCLWorker(barrier))]
    with vllm_process_env(ENGINE_ENV["nccl"]):  # nothing: the NCCL payloads are plain msgpack
        threads, rollout_errors = start_rollouts(wire, engines, "nccl", syncs=2, versions=(5, 6))
        senders = nccl_senders(wire, routes, barrier, broadcast)
        assert run_actor_ranks(senders, version=50) == []  # the actor's optimizer steps: not the weights' label
        assert run_actor_ranks(senders, version=60) == []
        for t in threads:
            t.join(WAIT_S)
    assert rollout_errors == []

    for rank, engine in enumerate(engines):
        init, *updates = engine.worker.received
        # vLLM's worker init info: the rendezvous, 1 trainer + 2 engines x TP 2, this engine's first rank
        assert (init.master_address, init.master_port, init.world_size, init.rank_offset, init.packed) == (
            "10.0.0.1",
            4242,
            5,
            1 + 2 * rank,
            True,
        )
        assert [(u.names, u.dtype_names, u.shapes) for u in updates] == [
            (list(WEIGHTS), ["float32", "bfloat16", "float32"], [[4, 3], [2, 3], [4, 3]])
        ] * 2
        one_sync = [
            "pause_generation",
            "start_weight_update",
            "update_weights",
            "finish_weight_update",
            "reset_prefix_cache",
            "reset_encoder_cache",
            "resume_generation",
        ]
        assert engine.names() == ["init_weight_transfer_engine"] + one_sync * 2  # no sleep: the engine owns its GPUs
        assert [a["weight_version"] for n, a in engine.calls if n == "finish_weight_update"] == ["5", "6"]
        assert [a["mode"] for n, a in engine.calls if n == "pause_generation"] == ["wait", "wait"]
        assert engine.serving
    assert broadcast == [list(WEIGHTS)] * 2  # rank 0 broadcast everything, in metadata order, once per sync
    # only actor rank 0 talks to the rollout ranks; the other rank holds the same weights and sends nothing
    assert {src for src, _, _ in wire.sent} == {0}
    assert [type(m).__name__ for src, dst, m in wire.sent if dst == 1][:3] == ["SyncHeader", "EngineCall", "EngineCall"]


def test_nccl_route_keeps_serving_and_each_turn_gets_one_version(monkeypatch):
    """Disaggregated (written, not GPU-verified): the rollout worker serves a later batch's turns while the actor's
    transfer runs. The turn running when START comes finishes on the old weights (pause in wait mode: one label,
    the old one), a turn asked for during the transfer waits and is sampled by the new weights, labelled with the
    driver's version at FINISH (the actor's header version is not the label)."""
    from rlinf_ext.generation.vllm_engine import VLLMGenerator
    from rlinf_ext.protocol.generation import SamplingParams
    from tests.support.scripted import CharTokenizer

    routes = SyncRoutes("broadcast", actor_world=1, rollout_dp=1)
    wire, barrier = Wire(1, 1), threading.Barrier(2)
    engine = ServingEngine(NCCLWorker(barrier))
    w = FakeRollout(wire, 0)
    w._setup(CFG, verify_sync=True)
    w._attach(VLLMGenerator(engine, CharTokenizer(), [0], in_process=False), SamplingParams(max_new_tokens=4))
    w.sync_routes, w.gpu_sync = routes, VLLMGpuSync(engine, "nccl")
    turn = {"prompt_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 40}, "seed": 3}
    outcome: dict = {}

    async def rollout():
        await w._label_initial_weights()
        running = asyncio.create_task(w._generate({"channel_key": "b+1", **turn}))
        while not engine.running:
            await asyncio.sleep(0.001)
        sync = asyncio.create_task(w._receive_and_load(5))
        while not engine.paused:
            await asyncio.sleep(0.001)
        outcome["running at pause"] = engine.running == 1 and not running.done()
        asked_during = asyncio.create_task(w._generate({"channel_key": "b+2", **turn}))
        outcome["replies"] = [await running, await asked_during]
        await sync

    def rollout_thread():
        try:
            asyncio.run(rollout())
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=rollout_thread, daemon=True)
    with vllm_process_env(ENGINE_ENV["nccl"]):
        thread.start()
        while not engine.running:
            time.sleep(0.001)
        assert run_actor_ranks(nccl_senders(wire, routes, barrier, []), version=50) == []
        thread.join(WAIT_S)
    assert "error" not in outcome, outcome.get("error")
    first, second = outcome["replies"]
    assert outcome["running at pause"]
    assert first["weight_version"] == 0 and len(first["output_ids"]) == 40  # all 40 tokens on the old weights
    assert second["weight_version"] == 5 == w.weight_version and engine.weight_version == "5"
    assert [a["mode"] for n, a in engine.calls if n == "pause_generation"] == ["wait"]
    assert [a["new_version"] for n, a in engine.calls if n == "update_weight_version"] == ["0"]
    assert [a["weight_version"] for n, a in engine.calls if n == "finish_weight_update"] == ["5"]
    assert ("set_weight_version", ["5"]) in engine.wire.sent and engine.serving


def test_nccl_route_with_partial_rollout_cuts_the_running_turn_which_goes_on_under_the_new_version():
    """Disaggregated with ``runner.partial_rollout`` (written, not GPU-verified): the worker's ``VLLMGpuSync`` pauses
    START in vLLM's keep mode, so the turn running when START comes stops where it is (no wait for its 40 tokens) and
    finishes after the transfer: its first tokens labelled by the old weights, the rest by the driver's version."""
    from rlinf_ext.generation.vllm_engine import VLLMGenerator
    from rlinf_ext.protocol.generation import SamplingParams
    from tests.support.scripted import CharTokenizer

    routes = SyncRoutes("broadcast", actor_world=1, rollout_dp=1)
    wire, barrier = Wire(1, 1), threading.Barrier(2)
    engine = ServingEngine(NCCLWorker(barrier))
    w = FakeRollout(wire, 0)
    partial = SimpleNamespace(
        actor=CFG.actor,
        runner=SimpleNamespace(partial_rollout=True),
        rollout=SimpleNamespace(**vars(CFG.rollout), vllm=SimpleNamespace(sleep_level=2)),
    )
    w._setup(partial, verify_sync=True)
    generator = VLLMGenerator(engine, CharTokenizer(), [0], in_process=False)
    generator.options = VLLMEngineOptions(model_path="m", in_process=False, weight_transfer_backend="nccl")
    w._attach(generator, SamplingParams(max_new_tokens=4))
    w.sync_routes = routes
    turn = {"channel_key": "b+1", "prompt_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 40}, "seed": 3}
    outcome: dict = {}

    async def rollout():
        await w._label_initial_weights()
        running = asyncio.create_task(w._generate(turn))
        while not engine.running:
            await asyncio.sleep(0.001)
        sync = asyncio.create_task(w._receive_and_load(5))
        while not engine.paused:
            await asyncio.sleep(0.001)
        await sync
        outcome["reply"] = await running

    def rollout_thread():
        try:
            asyncio.run(rollout())
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=rollout_thread, daemon=True)
    with vllm_process_env(ENGINE_ENV["nccl"]):
        thread.start()
        while not engine.running:
            time.sleep(0.001)
        assert run_actor_ranks(nccl_senders(wire, routes, barrier, []), version=50) == []
        thread.join(WAIT_S)
    assert "error" not in outcome, outcome.get("error")
    versions = outcome["reply"]["weight_version"]
    assert len(versions) == 40 and versions[0] == 0 and versions[-1] == 5
    assert versions == sorted(versions) and set(versions) == {0, 5}  # one cut: old tokens, then new ones
    assert [a["mode"] for n, a in engine.calls if n == "pause_generation"] == ["keep"]
    assert engine.serving and w.weight_version == 5


def test_a_start_that_times_out_mid_pause_resumes_the_engine():
    """Disaggregated: START's pause in wait mode outlasts the worker's timeout (a turn that will not end soon):
    vLLM has already paused its scheduler when the wait is cancelled, so the worker resumes it (as after a refused
    INIT) and raises the timeout, answered to the actor; the turn then finishes on the old weights."""
    from rlinf_ext.generation.vllm_engine import VLLMGenerator
    from rlinf_ext.protocol.generation import SamplingParams
    from rlinf_ext.sync.engine_calls import EngineReply
    from rlinf_ext.sync.vllm_transfer import START
    from rlinf_ext.sync.weight_sync import SYNC_END
    from tests.support.scripted import CharTokenizer

    wire = Wire(1, 1)
    engine = ServingEngine(NCCLWorker())
    w = FakeRollout(wire, 0)
    w._setup(CFG, verify_sync=True)
    w.sync_timeout_s = 0.3
    w._attach(VLLMGenerator(engine, CharTokenizer(), [0], in_process=False), SamplingParams(max_new_tokens=4))
    w.sync_routes, w.gpu_sync = SyncRoutes("broadcast", actor_world=1, rollout_dp=1), VLLMGpuSync(engine, "nccl")
    for message in (SyncHeader(version=1, sender=0), EngineCall(START), SYNC_END):
        wire.down[(0, 0)].put(message)  # what actor rank 0 sends (SYNC_END: reached only if START succeeds)
    long_turn = {"channel_key": "uid-long", "prompt_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1000}}

    async def go():
        await w._label_initial_weights()
        turn = asyncio.create_task(w._generate(long_turn))  # 1000 engine steps of 2 ms: well past the timeout
        while not engine.running:
            await asyncio.sleep(0.001)
        with pytest.raises(WeightSyncError) as raised:
            await w._receive_and_load(5)
        serving_after = engine.serving
        return str(raised.value), serving_after, await turn

    message, serving_after, reply = asyncio.run(go())
    assert START in message and "0.3 s" in message and "rank 0" in message, message
    assert serving_after, engine.names()  # not left paused
    assert engine.names()[-4:] == [
        "pause_generation",
        "reset_prefix_cache",
        "reset_encoder_cache",
        "resume_generation",
    ]  # no start_weight_update: START broke off in its pause
    answer = wire.up[(0, 0)].get_nowait()
    assert isinstance(answer, EngineReply) and answer.method == START and "0.3 s" in answer.error
    assert reply["weight_version"] == 0 == w.weight_version and len(reply["output_ids"]) == 1000


@pytest.mark.slow
def test_a_refused_update_reaches_the_actor_and_the_engine_serves_again():
    routes = SyncRoutes("broadcast", actor_world=1, rollout_dp=1)
    wire = Wire(1, 1)
    engine = RecordingEngine(NCCLWorker(fail_update=True))
    threads, rollout_errors = start_rollouts(wire, [engine], "nccl")
    # the trainer's broadcast has no peer (the engine failed before it): the actor's wait ends with the timeout
    # or with the engine's error, whichever comes first; either names the failure
    errors = run_actor_ranks(nccl_senders(wire, routes, threading.Barrier(2), [], timeout_s=3.0), version=1)
    threads[0].join(WAIT_S)
    assert len(errors) == 1 and isinstance(errors[0], WeightSyncError)
    assert "illegal memory access" in str(errors[0]) or "did not finish within 3 s" in str(errors[0])
    assert rollout_errors and "illegal memory access" in str(rollout_errors[0])
    assert engine.names()[-4:] == [
        "finish_weight_update",
        "reset_prefix_cache",
        "reset_encoder_cache",
        "resume_generation",
    ]
    assert engine.serving


def test_an_engine_that_never_answers_times_out():
    routes = SyncRoutes("broadcast", actor_world=1, rollout_dp=1)
    client = RolloutEngineClient(FakeActor(Wire(1, 1), 0), "RolloutGroup", routes, timeout_s=0.3)
    with pytest.raises(WeightSyncError, match="rollout rank 0's answer to start_weight_update did not complete"):
        client.start_weight_update()


# ------------------------------------------------------------------------------------------------ IPC route
@pytest.fixture
def host_gpus(monkeypatch, tmp_path):
    """CUDA on host for this process (``HostCuda``, ``HostIpc`` producer and consumer), and the ``ipc`` engine's
    process environment."""
    log: list = []
    cuda = HostCuda(log)
    cuda.install(monkeypatch.setattr)
    ipc = HostIpc(tmp_path, cuda)
    ipc.install_producer(monkeypatch.setattr)
    ipc.install_consumer(monkeypatch.setattr)
    monkeypatch.setattr(HostIPCTrainer, "ipc", ipc, raising=False)
    with vllm_process_env(ENGINE_ENV["ipc"]):
        yield SimpleNamespace(cuda=cuda, ipc=ipc, log=log)


def ipc_sender(wire, rank, routes, timeout_s=WAIT_S):
    return VLLMTransferSender(
        FakeActor(wire, rank),
        "ipc",
        routes,
        rollout_group="RolloutGroup",
        bucket_bytes=SMALL_BUFFER,
        timeout_s=timeout_s,
        trainer_init=HostIPCTrainer.trainer_init,
    )


def test_ipc_route_packed_and_the_kv_cache_woken_after_the_actor_freed_its_memory(host_gpus):
    """One actor rank on GPU 1 (its caller's device, not the watchdog thread's 0) and its engine there: vLLM's packed
    producer fills one buffer per sync in two chunks, the engine's vLLM worker opens it once per sync and loads it
    in place; the actor frees its transfer memory before the engine maps its KV cache again."""
    routes = SyncRoutes("paired", actor_world=1, rollout_dp=1)
    wire, log = Wire(1, 1), host_gpus.log
    engine = RecordingEngine(ipc_worker(loadable_model(), device_index=1), log=log)
    threads, rollout_errors = start_rollouts(wire, [engine], "ipc", syncs=2)
    sender = ipc_sender(wire, 0, routes)
    for version in (1, 2):
        assert run_actor_ranks([sender], version, versioned(version), device_of=lambda rank: 1) == []
    threads[0].join(WAIT_S)
    assert rollout_errors == []
    state, expected = model_state(engine), weights_of(0, 2)
    assert all(torch.equal(state[k], expected[k]) for k in WEIGHTS)  # the second sync's weights, in place

    one_sync = [
        "sleep",
        "wake_up",
        "start_weight_update",
        "update_weights",
        "update_weights",
        "finish_weight_update",
        "wake_up",
        "reset_prefix_cache",
        "reset_encoder_cache",
        "resume_generation",
    ]
    # init comes once, with the first sync, after the engine went to sleep
    assert engine.names() == one_sync[:1] + ["init_weight_transfer_engine"] + one_sync[1:] + one_sync
    wakes = [a["tags"] for n, a in engine.calls if n == "wake_up"]
    assert wakes == [["weights"], ["kv_cache"]] * 2 and engine.serving
    assert [a["level"] for n, a in engine.calls if n == "sleep"] == [2, 2]
    updates = [a["request"].update_info for n, a in engine.calls if n == "update_weights"]
    assert [u["names"] for u in updates[:2]] == [list(WEIGHTS)[:2], list(WEIGHTS)[2:]]
    assert all(set(u["ipc_handles"]) == {"GPU-1"} for u in updates)  # the caller's device, through the watchdog
    # one buffer per sync, opened once by the engine on its device for both chunks (vLLM's PackedBufferImporter)
    assert [device for _, device in host_gpus.ipc.opened] == [1, 1]
    assert len({name for name, _ in host_gpus.ipc.opened}) == 2

    # per sync: FINISH (vLLM lets go of the buffer), then the actor's ipc_collect and empty_cache on GPU 1,
    # then the KV cache's wake-up
    events = [(e[0], e[1], e[2] if e[0] == "cuda" else e[2].get("tags")) for e in log]
    for k in range(2):
        finish = [i for i, e in enumerate(events) if e[1] == "finish_weight_update"][k]
        kv = [i for i, e in enumerate(events) if e == ("engine", "wake_up", ["kv_cache"])][k]
        freed = [i for i, e in enumerate(events) if e == ("cuda", "empty_cache", 1) and finish < i]
        collected = [i for i, e in enumerate(events) if e == ("cuda", "ipc_collect", 1) and finish < i]
        assert freed and collected and max(freed[0], collected[0]) < kv, events


def test_the_ipc_buffer_holds_the_largest_tensor():
    from vllm.distributed.weight_transfer.base import ParamMeta

    embed_7b = ParamMeta("model.embed_tokens.weight", torch.bfloat16, (152064, 3584))
    assert ipc_buffer_bytes([embed_7b, ParamMeta("b", torch.float32, (3584,))], 1 << 30) == 1_089_994_752 > 1 << 30
    assert ipc_buffer_bytes([ParamMeta("w", torch.float32, (4, 3))], 64) == 64
    assert ipc_buffer_bytes([], 64) == 64


def test_a_tensor_larger_than_the_bucket_crosses_the_ipc_route(host_gpus):
    """vLLM's packed producer refuses a tensor larger than its buffer: the buffer grows to the largest tensor."""
    big = {"model.embed_tokens.weight": torch.arange(24.0).reshape(8, 3), "lm_head.weight": torch.ones(2, 3)}
    wire = Wire(1, 1)
    engine = RecordingEngine(ipc_worker(loadable_model(big), device_index=0))
    threads, rollout_errors = start_rollouts(wire, [engine], "ipc")
    sender = ipc_sender(wire, 0, SyncRoutes("paired", actor_world=1, rollout_dp=1))
    assert run_actor_ranks([sender], 1, versioned(1, big)) == []
    threads[0].join(WAIT_S)
    assert rollout_errors == [] and sender.engine.packed_buffer_size_bytes == 96 > SMALL_BUFFER
    state = model_state(engine)
    assert all(torch.equal(state[k], v) for k, v in weights_of(0, 1, big).items())


@pytest.mark.parametrize("refused", ["init", "start"])
def test_a_refused_init_or_start_leaves_the_engine_serving(host_gpus, refused):
    """vLLM refuses INIT (an engine started without a weight-transfer config) or START (an update already active):
    the actor gets the error, and the engine, asleep since the rollout, is woken fully and resumed."""
    routes = SyncRoutes("paired", actor_world=1, rollout_dp=1)
    wire = Wire(1, 1)
    worker = ipc_worker(loadable_model(), device_index=0, configured=refused != "init")
    worker._weight_update_active = refused == "start"
    engine = RecordingEngine(worker)
    threads, rollout_errors = start_rollouts(wire, [engine], "ipc")
    errors = run_actor_ranks([ipc_sender(wire, 0, routes, timeout_s=5.0)], version=1)
    threads[0].join(WAIT_S)
    match = "Weight transfer not configured" if refused == "init" else "already active"
    assert len(errors) == 1 and match in str(errors[0]) and match in str(rollout_errors[0])
    assert engine.serving, engine.calls
    assert engine.names()[-3:] == ["reset_prefix_cache", "reset_encoder_cache", "resume_generation"]
    woken = [sorted(a["tags"]) for n, a in engine.calls if n == "wake_up"]
    assert woken == ([["kv_cache", "weights"]] if refused == "init" else [["weights"], ["kv_cache"]])


def test_sleep_level_and_no_sleep_while_generating():
    engine = RecordingEngine()
    sync = VLLMGpuSync(engine, "ipc", sleep_level=1)
    asyncio.run(sync.after_rollout())
    asyncio.run(sync.after_rollout())  # already asleep: not twice
    # "wait": in-flight requests finish; vLLM's default aborts
    assert engine.calls == [("sleep", {"level": 1, "mode": "wait"})] and not engine.serving
    nccl = VLLMGpuSync(engine, "nccl")
    asyncio.run(nccl.after_rollout())
    assert engine.names() == ["sleep"]  # a disaggregated engine never sleeps
    with pytest.raises(RuntimeError, match="before start_weight_update"):
        asyncio.run(nccl.handle(EngineCall("update_weights", {})))


# ------------------------------------------------------------------------------------------------ two actor ranks
def actor_rank_process(rank, world, init_file, root, wire, versions, results):
    """One actor rank in a process of its own (gloo default group, as RLinf's actor ranks), on GPU ``rank``: vLLM's
    IPC trainer engine all-gathers every rank's handles and rank 0 ships them to every engine."""
    try:
        log: list = []
        cuda = HostCuda(log)
        cuda.install(setattr)
        ipc = HostIpc(root, cuda)
        ipc.install_producer(setattr)
        HostIPCTrainer.ipc = ipc
        torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        torch.cuda.set_device(rank)
        sender = ipc_sender(wire, rank, SyncRoutes("paired", actor_world=world, rollout_dp=world))
        for version in versions:
            sender.sync(SyncHeader(version=version, sender=rank), versioned(version)(rank))
        results.put((rank, None, log))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((rank, traceback.format_exc(), None))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_packed_ipc_across_two_actor_ranks_each_engine_opens_its_own_gpu(host_gpus, tmp_path):
    """Two actor ranks (processes, gloo) each with its engine on its GPU: every rank's handle reaches both engines
    (vLLM's all-gather), each engine opens its own GPU's buffer and ends with that rank's weights."""
    # forked before any thread of this test starts: the ranks share this process's imports (a spawned rank
    # imports vLLM again, ~20 s on 2 cores) and its CUDA stand-ins, then install their own
    ctx = multiprocessing.get_context("fork")
    if torch.distributed.is_initialized():  # an earlier test's Megatron state in this worker: a fork would inherit
        from rlinf_ext.models.cpu_shims import destroy_parallel_state  # its default group, and the ranks need their own

        destroy_parallel_state()
    wire, versions = Wire(2, 2, make_queue=ctx.Queue), (1, 2)
    engines = [RecordingEngine(ipc_worker(loadable_model(), device_index=r)) for r in range(2)]
    results = ctx.Queue()
    ranks = [
        ctx.Process(
            target=actor_rank_process,
            args=(r, 2, str(tmp_path / "pg"), str(tmp_path), wire, versions, results),
            daemon=True,
        )
        for r in range(2)
    ]
    for p in ranks:
        p.start()
    threads, rollout_errors = start_rollouts(wire, engines, "ipc", syncs=len(versions))
    reports = sorted(results.get(timeout=WAIT_S * 3) for _ in ranks)
    for p in ranks:
        p.join(WAIT_S)
    for t in threads:
        t.join(WAIT_S)
    assert [error for _, error, _ in reports] == [None, None], "\n".join(e for _, e, _ in reports if e)
    assert rollout_errors == []
    for rank, engine in enumerate(engines):
        state, expected = model_state(engine), weights_of(rank, versions[-1])
        assert all(torch.equal(state[k], expected[k]) for k in WEIGHTS), rank
        updates = [a["request"].update_info for n, a in engine.calls if n == "update_weights"]
        assert len(updates) == 2 * len(versions)
        assert all(set(u["ipc_handles"]) == {"GPU-0", "GPU-1"} for u in updates)  # both ranks' handles
    # each engine opened only its own GPU's buffer, once per sync
    opened = sorted(host_gpus.ipc.opened)
    assert [(name.split("-")[0], device) for name, device in opened] == [("gpu0", 0)] * 2 + [("gpu1", 1)] * 2
    for rank, _, log in reports:  # each rank freed its memory on its own GPU after every sync
        assert [e for e in log if e[1] == "empty_cache"] == [("cuda", "empty_cache", rank)] * len(versions)
