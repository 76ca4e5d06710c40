"""The SGLang distributed weight route (``sync/sglang_transfer.py``) on CPU: actor rank 0's
``SGLangDistributedSender`` drives two rollout ranks running the real worker logic (``SGLangRolloutState``) over a
recording stand-in of ``SGLangControl``. Replaced, as a GPU would need them: the process-group creation (a
rendezvous barrier of every member, recording each member's rank) and the NCCL broadcast (the actor's tensors
handed to the engines' receives at a barrier, as NCCL meets both sides in one collective). NOT a GPU test: the
route is "written, not GPU-verified"."""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
from types import ModuleType, SimpleNamespace

import pytest
import torch
from rlinf.scheduler import Worker
from transfer_fakes import Done, Op, Pending  # noqa: E402

from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.sync.engine_calls import EngineCall
from rlinf_ext.sync.sglang_transfer import (
    GROUP_NAME,
    SGLangDistributedSender,
    named_buckets,
    nccl_broadcast,
    sglang_init_group,
    update_request,
    uses_sglang_distributed,
)
from rlinf_ext.sync.weight_sync import SYNC_END, SyncHeader, SyncRoutes, WeightSyncError
from rlinf_ext.workers.rollout_sglang import SGLangControl, SGLangRolloutState
from tests.support.sglang_fakes import UTILS, RecordingEngine, RecordingTokenizerManager, SourceSerializer
from tests.support.signature_checks import bind_like, checked_against

pytestmark = pytest.mark.timeout(120)
WAIT_S = 60.0  # a thread of this test waits on the others; a loaded 2-core CI box once took over 20 s


# ------------------------------------------------------------------------------------------------ pure parts
def cfg_of(placement, backend="sglang"):
    return SimpleNamespace(
        rollout=SimpleNamespace(rollout_backend=backend),
        cluster=SimpleNamespace(num_nodes=1, num_gpus_per_node=8, component_placement=placement),
    )


def test_only_disaggregated_sglang_on_gpus_takes_this_route():
    assert uses_sglang_distributed(cfg_of({"actor": "0-3", "rollout,reward": "4-7"}), cuda=True)
    assert not uses_sglang_distributed(cfg_of({"actor,rollout,reward": "all"}), cuda=True)  # collocated: IPC route
    assert not uses_sglang_distributed(cfg_of({"actor": "0-3", "rollout,reward": "4-7"}), cuda=False)
    assert not uses_sglang_distributed(cfg_of({"actor": "0-3", "rollout,reward": "4-7"}, "vllm"), cuda=True)
    assert not uses_sglang_distributed(cfg_of({"rollout,reward": "all"}), cuda=True)  # evaluation: no actor


def test_buckets_keep_the_order_and_the_size_bound():
    named = [("a", torch.zeros(4)), ("b", torch.zeros(4)), ("c", torch.zeros(12)), ("d", torch.zeros(2))]  # fp32
    assert [[n for n, _ in b] for b in named_buckets(named, 32)] == [["a", "b"], ["c"], ["d"]]  # c (48 B) alone


def test_the_update_request_names_sglang_dtypes_and_shapes():
    bucket = [("w", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b", torch.zeros(3, dtype=torch.float32))]
    assert update_request(bucket) == {
        "names": ["w", "b"],
        "dtypes": ["bfloat16", "float32"],
        "shapes": [[2, 3], [3]],
        "group_name": GROUP_NAME,
        "flush_cache": False,
    }
    assert getattr(torch, update_request(bucket)["dtypes"][0]) is torch.bfloat16  # how SGLang reads it back


def test_the_actor_joins_with_sglangs_own_group_call(sglang_source, monkeypatch):
    """``sglang_init_group`` calls sglang's ``init_custom_process_group`` (NCCL: replaced here by a stand-in checked
    against sglang's signature) with the keywords its TP workers use, the host bracketed when it is IPv6."""
    calls = []

    def init_custom_process_group(*args, **kwargs):
        signature = sglang_source.signature(UTILS, "init_custom_process_group")
        calls.append(bind_like(signature, *args, label="sglang's init_custom_process_group", **kwargs).arguments)
        return "group"

    utils = ModuleType(UTILS)
    utils.init_custom_process_group = init_custom_process_group
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    monkeypatch.setitem(sys.modules, UTILS, utils)
    for host, url in (("10.0.0.1", "tcp://10.0.0.1:29555"), ("fd00::1", "tcp://[fd00::1]:29555")):
        assert (
            sglang_init_group(master_address=host, master_port=29555, world_size=5, rank=0, group_name=GROUP_NAME)
            == "group"
        )
        assert {k: calls[-1][k] for k in ("backend", "init_method", "world_size", "rank", "group_name")} == {
            "backend": "nccl",
            "init_method": url,
            "world_size": 5,
            "rank": 0,
            "group_name": GROUP_NAME,
        }


# ------------------------------------------------------------------------------------------------ fakes
class Wire:
    """RLinf's messages between actor rank 0 and the rollout ranks, as queues."""

    def __init__(self, rollouts: int):
        self.down = [queue.Queue() for _ in range(rollouts)]
        self.up = [queue.Queue() for _ in range(rollouts)]
        self.sent: list[tuple[int, object]] = []


class FakeActor:
    """Actor rank 0's RLinf ``Worker.send``/``recv`` (checked against RLinf's) over the wire's queues."""

    _rank = 0

    def __init__(self, wire: Wire):
        self.wire = wire

    @checked_against(Worker.send)
    def send(self, object, dst_group_name, dst_rank, async_op=False, options=None, piggyback_payload=None):
        assert async_op, "the sender polls its work handles (engine_calls.wait_work)"
        self.wire.sent.append((dst_rank, object))
        self.wire.down[dst_rank].put(object)
        return Done()

    @checked_against(Worker.recv)
    def recv(self, src_group_name, src_rank, async_op=False, options=None):
        assert async_op, "the sender polls its work handles (engine_calls.wait_work)"
        return Pending(self.wire.up[src_rank])


class Collective:
    """The weight-update group's stand-in: ``join`` records a member's rank and waits for all of them (the TCP
    rendezvous); the actor's ``broadcast`` leaves its tensors for the engines and meets their receives."""

    def __init__(self, engines: int, hang: bool = False):
        self.engines, self.hang = engines, hang
        self.ranks: list[tuple[str, int, int]] = []  # (who, rank, world)
        self.lock = threading.Lock()
        self.rendezvous = threading.Barrier(1 + engines)
        self.meet = threading.Barrier(1 + engines)
        self.sent: list[torch.Tensor] = []
        self.broadcasts = 0

    def join(self, who, rank, world):
        with self.lock:
            self.ranks.append((who, rank, world))
        if who == "actor" or not self.hang:
            self.rendezvous.wait(WAIT_S)

    @checked_against(sglang_init_group)  # the actor's: the real one calls sglang's init_custom_process_group
    def init_group(self, *, master_address, master_port, world_size, rank, group_name):
        assert (master_address, master_port, group_name) == ("10.0.0.1", 29555, GROUP_NAME)
        self.join("actor", rank, world_size)
        return "group"

    @checked_against(nccl_broadcast)  # the actor's, src 0
    def broadcast(self, tensors, group):
        assert group == "group"
        self.sent = [t.clone() for t in tensors]
        self.broadcasts += 1
        self.meet.wait(WAIT_S)  # the engines copy
        self.meet.wait(WAIT_S)  # ... and are done


class CollectiveManager(RecordingTokenizerManager):
    """sglang's ``TokenizerManager`` (checked, tests/support/sglang_fakes.py): ``init_weights_update_group`` joins as
    SGLang's TP workers do (``rank_offset + tp_rank``), ``update_weights_from_distributed`` receives the actor's
    broadcast in the request's order."""

    def __init__(self, source, collective: Collective, tp: int, fail_update: bool = False):
        super().__init__(source)
        self.collective, self.tp, self.fail_update = collective, tp, fail_update
        self.loaded: dict[str, torch.Tensor] = {}
        self.gate = None  # the rollout worker's WeightGate (FakeRollout sets it)
        self.gate_closed_at_flush: list[bool] = []

    async def on_init_weights_update_group(self, obj):
        for tp_rank in range(self.tp):
            with self.collective.lock:
                self.collective.ranks.append(("engine", obj.rank_offset + tp_rank, obj.world_size))
        await asyncio.to_thread(self.collective.join, "engine-leader", -1, obj.world_size)
        return True, ""

    async def on_update_weights_from_distributed(self, obj):
        if self.fail_update:
            return False, "shape mismatch"
        await asyncio.to_thread(self.collective.meet.wait, WAIT_S)
        got = self.collective.sent
        assert [list(t.shape) for t in got] == obj.shapes
        assert [str(t.dtype).removeprefix("torch.") for t in got] == obj.dtypes
        self.loaded.update(dict(zip(obj.names, got)))
        await asyncio.to_thread(self.collective.meet.wait, WAIT_S)
        return True, ""

    async def on_flush_cache(self, obj):
        self.gate_closed_at_flush.append(self.gate.paused)
        return self.io.FlushCacheReqOutput(success=True)


class NoProbeEngine(RecordingEngine):
    async def reply(self, arguments):
        raise AssertionError("no probe in these syncs")


def control_of(source, collective: Collective, tp: int, fail_update: bool = False):
    """The real ``SGLangControl`` over a checked engine whose manager takes part in the collective."""
    manager = CollectiveManager(source, collective, tp, fail_update)
    return SGLangControl(NoProbeEngine(source, manager), source.io_struct, SourceSerializer(source))


CFG = SimpleNamespace(
    actor=SimpleNamespace(group_name="ActorGroup"),
    rollout=SimpleNamespace(
        group_name="RolloutGroup",
        tensor_parallel_size=2,
        return_logprobs=False,
        model=SimpleNamespace(precision="bf16"),
    ),  # a GPU engine's dtype
    runner=SimpleNamespace(max_staleness=0),
)


class FakeRollout(SGLangRolloutState):
    def __init__(self, wire: Wire, rank: int, control):
        self.wire, self._rank = wire, rank
        self._setup(CFG, verify_sync=True, collocated=False, distributed=True)
        self._attach(control, lambda ids: "", [7], SamplingParams())
        control.manager.gate = self.gate

    @checked_against(Worker.recv)
    def recv(self, src_group_name, src_rank, async_op=False, options=None):
        assert async_op, "an async worker awaits its receives"
        return Op(asyncio.to_thread(self.wire.down[self._rank].get, True, WAIT_S))

    @checked_against(Worker.send)
    def send(self, object, dst_group_name, dst_rank, async_op=False, options=None, piggyback_payload=None):
        assert async_op, "an async worker awaits its sends"
        self.wire.up[self._rank].put(object)
        return Op()


STATE = {
    "model.embed_tokens.weight": torch.arange(16.0).view(4, 4).bfloat16(),
    "lm_head.weight": torch.ones(4, 4),
    "model.norm.weight": torch.full((4,), 2.0),
}


def start_rollouts(wire, controls, syncs, errors):
    """One thread per rollout rank receiving ``syncs`` transfers; what a rank raises goes to ``errors`` and breaks
    the rendezvous, so an actor still waiting there fails at once instead of waiting out its timeout."""

    def run(rank):
        worker = None
        try:
            worker = FakeRollout(wire, rank, controls[rank])
            for version in range(1, syncs + 1):
                asyncio.run(worker._receive_distributed(version))
        except BaseException as exc:
            errors.append(exc)
            collective = getattr(controls[rank].engine.tokenizer_manager, "collective", None)
            if collective is not None:
                collective.rendezvous.abort()
        if worker is not None:
            controls[rank].engine.tokenizer_manager.version = worker.weight_version

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(len(controls))]
    for t in threads:
        t.start()
    return threads


def sender_of(wire, collective, engines, tp, timeout_s=WAIT_S, bucket_bytes=96):
    return SGLangDistributedSender(
        FakeActor(wire),
        SyncRoutes("broadcast", actor_world=2, rollout_dp=engines, rollout_tp=tp),
        rollout_group="RolloutGroup",
        bucket_bytes=bucket_bytes,
        timeout_s=timeout_s,
        init_group=collective.init_group,
        broadcast=collective.broadcast,
        rendezvous=lambda: ("10.0.0.1", 29555),
    )


# ------------------------------------------------------------------------------------------------ call order
def test_two_engines_of_tp2_join_once_with_their_offsets_and_load_every_bucket_in_order(sglang_source):
    engines, tp = 2, 2
    wire, collective = Wire(engines), Collective(engines)
    controls = [control_of(sglang_source, collective, tp) for _ in range(engines)]
    errors: list = []
    threads = start_rollouts(wire, controls, syncs=2, errors=errors)
    sender = sender_of(wire, collective, engines, tp)
    for version in (1, 2):
        try:
            sender.sync(SyncHeader(version=version, sender=0), lambda: iter(STATE.items()))
        except Exception as exc:  # a rollout rank that died first is the cause: show it
            raise AssertionError(f"sync {version} failed; the rollout ranks raised {errors!r}") from exc
    for t in threads:
        t.join(WAIT_S)
    assert not errors
    # one group of 1 + 2 x 2 ranks: the actor 0, engine 0 at 1-2, engine 1 at 3-4
    assert sorted((r, w) for who, r, w in collective.ranks if who in ("actor", "engine")) == [(i, 5) for i in range(5)]
    buckets = [
        ("model.embed_tokens.weight", "lm_head.weight"),
        ("model.norm.weight",),
    ]  # 32 + 64 B fill 96 B; + 16 B would not
    managers = [c.engine.tokenizer_manager for c in controls]
    for manager in managers:
        sync = ["begin", *(("update", b) for b in buckets), "end", "flush"]
        assert manager.calls[0][0] == "init_group" and manager.calls[1:] == sync + sync  # the group once, first
        assert manager.version == 2
        assert manager.gate_closed_at_flush == [True, True]  # flushed before the gate let new requests in
        for name, tensor in STATE.items():
            assert torch.equal(manager.loaded[name], tensor) and manager.loaded[name].dtype == tensor.dtype
    assert [m.calls[0][1:] for m in managers] == [(1, 5), (3, 5)]  # rank offsets per engine, the world
    assert collective.broadcasts == 2 * len(buckets)
    kinds = [type(m).__name__ if not isinstance(m, str) else m for dst, m in wire.sent if dst == 1]
    assert kinds[:3] == ["SyncHeader", "EngineCall", "EngineCall"] and kinds[-1] == SYNC_END


def test_the_other_actor_ranks_send_nothing():
    wire, collective = Wire(1), Collective(1)
    actor = FakeActor(wire)
    actor._rank = 1
    sender = SGLangDistributedSender(
        actor,
        SyncRoutes("broadcast", actor_world=2, rollout_dp=1),
        rollout_group="RolloutGroup",
        init_group=collective.init_group,
        broadcast=collective.broadcast,
    )
    sender.sync(SyncHeader(version=1, sender=1), lambda: iter(STATE.items()))
    assert wire.sent == [] and collective.ranks == []


def test_an_engine_that_never_joins_times_the_rendezvous_out(sglang_source):
    wire, collective = Wire(1), Collective(1, hang=True)
    errors: list = []
    start_rollouts(wire, [control_of(sglang_source, collective, 1)], syncs=1, errors=errors)
    sender = sender_of(wire, collective, 1, 1, timeout_s=0.5)
    with pytest.raises(WeightSyncError, match="rendezvous did not finish within 0.5 s"):
        sender.sync(SyncHeader(version=1, sender=0), lambda: iter(STATE.items()))
    assert sender.group is None


def test_a_failed_engine_update_is_raised_on_the_actor_and_the_session_still_ends(sglang_source):
    wire, collective = Wire(1), Collective(1)
    control = control_of(sglang_source, collective, 1, fail_update=True)
    errors: list = []
    threads = start_rollouts(wire, [control], syncs=1, errors=errors)
    collective.meet = threading.Barrier(1)  # the failed engine never receives: the actor's broadcast goes alone
    sender = sender_of(wire, collective, 1, 1)
    with pytest.raises(
        WeightSyncError, match="SGLang refused update_weights_from_distributed: rank 0: .*shape mismatch"
    ):
        sender.sync(SyncHeader(version=1, sender=0), lambda: iter(STATE.items()))
    for t in threads:
        t.join(WAIT_S)
    assert control.engine.tokenizer_manager.calls[1:] == [
        "begin",
        ("update", ("model.embed_tokens.weight", "lm_head.weight")),
        "end",
    ]
    assert isinstance(errors[0], WeightSyncError)


def test_a_call_outside_the_route_is_refused_by_the_rollout(sglang_source):
    wire = Wire(1)
    errors: list = []
    start_rollouts(wire, [control_of(sglang_source, Collective(1), 1)], syncs=1, errors=errors)
    wire.down[0].put(SyncHeader(version=1, sender=0))
    wire.down[0].put(EngineCall("update_weights", {}))  # a vLLM call
    import time

    deadline = time.monotonic() + WAIT_S
    while not errors and time.monotonic() < deadline:
        time.sleep(0.01)
    assert errors and "unexpected message" in str(errors[0])
