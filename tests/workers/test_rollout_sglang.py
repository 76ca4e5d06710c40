"""The SGLang rollout worker's logic on CPU without Ray or sglang (the engine needs a GPU): how received buckets
become sglang 0.5.23's per-TP-rank ``serialized_named_tensors`` (checked by loading each payload the way a TP
scheduler does: ``TpModelWorker.deserialize_own_rank`` opens entry ``tp_rank``); and the order of the engine calls (release / resume / begin / update / end / flush / probe): the real ``SGLangControl`` over
a recording engine whose every call is checked against sglang 0.5.23's signatures (tests/support/sglang_fakes.py),
fed by the real ``sync/weight_sync.py`` paired route over a fake transport (the disaggregated route:
tests/sync/test_sglang_transfer.py)."""

from __future__ import annotations

import asyncio
import pickle
from types import SimpleNamespace

import pytest
import torch
from channel_fakes import Channel, Op  # noqa: E402
from rlinf.scheduler import Worker

from rlinf_ext.protocol.generation import STOP_SERVING, SamplingParams
from rlinf_ext.sync.weight_sync import (
    SYNC_ACK,
    SYNC_END,
    SyncHeader,
    SyncRoutes,
    WeightSyncError,
    pack_buckets,
    prepare_handles,
    serialize_handle,
    share_bucket,
)
from rlinf_ext.workers.rollout_sglang import (
    CACHE_TAGS,
    WEIGHTS_TAGS,
    SGLangControl,
    SGLangRolloutState,
    rank_payloads,
    reduction_of,
)
from tests.support.sglang_fakes import (
    MANAGER,
    RecordingEngine,
    RecordingTokenizerManager,
    SourceSerializer,
    forking_serialize,
)
from tests.support.sglang_source import check_call
from tests.support.signature_checks import checked_against


# ------------------------------------------------------------------------------------------------ payloads
def buckets_of(state: dict[str, torch.Tensor], max_bytes: int = 1 << 20):
    return list(pack_buckets(state.items(), max_bytes=max_bytes, shared=True))


def test_a_handle_is_repickled_without_being_opened():
    prepare_handles(torch.device("cpu"))
    tensor = torch.arange(5.0).share_memory_()
    blob = serialize_handle(tensor)
    reduced = reduction_of(blob)
    assert not isinstance(reduced, torch.Tensor)  # nothing was rebuilt here
    again = pickle.loads(forking_serialize([("w", reduced)]))
    assert again[0][0] == "w" and torch.equal(again[0][1], tensor)
    tensor[0] = 42.0  # the same shared memory, not a copy
    assert again[0][1][0] == 42.0
    with pytest.raises(WeightSyncError, match="not through torch's reductions"):
        reduction_of(pickle.dumps([1, 2]))


def test_each_tp_rank_gets_the_payload_of_its_own_slot():
    """Paired route, an engine of TP 2: slot k's handles come from the actor rank on GPU k, and TP rank k loads
    exactly those (each slot has different values here)."""
    prepare_handles(torch.device("cpu"))
    slot0 = share_bucket(buckets_of({"a": torch.zeros(3), "b": torch.zeros(2, 2)})[0])
    slot1 = share_bucket(buckets_of({"a": torch.ones(3), "b": torch.ones(2, 2)})[0])
    payloads = rank_payloads([slot0, slot1], 2, serialize=forking_serialize)
    assert len(payloads) == 2
    for rank, fill in ((0, 0.0), (1, 1.0)):
        loaded = dict(pickle.loads(payloads[rank]))  # deserialize_own_rank: entry tp_rank only
        assert list(loaded) == ["a", "b"]
        assert torch.equal(loaded["a"], torch.full((3,), fill)) and torch.equal(loaded["b"], torch.full((2, 2), fill))
    with pytest.raises(WeightSyncError, match="TP size 3"):
        rank_payloads([slot0, slot1], 3, forking_serialize)
    other = share_bucket(buckets_of({"c": torch.zeros(3)})[0])
    with pytest.raises(WeightSyncError, match="different buckets"):
        rank_payloads([slot0, other], 2, forking_serialize)


def test_a_broadcast_bucket_is_refused():
    """A whole bucket is the RLinf broadcast route's, which SGLang no longer takes (sync/sglang_transfer.py)."""
    with pytest.raises(WeightSyncError, match="one handle bucket per TP slot"):
        rank_payloads(buckets_of({"w": torch.zeros(2)}), 1, forking_serialize)


# ------------------------------------------------------------------------------------------------ call order
class LoadingManager(RecordingTokenizerManager):
    """sglang's ``TokenizerManager`` (checked, tests/support/sglang_fakes.py) that loads each update's rank-0 payload."""

    def __init__(self, source, fail_update: bool = False):
        super().__init__(source)
        self.loaded: dict[str, torch.Tensor] = {}
        self.fail_update = fail_update

    async def on_update_weights_from_tensor(self, obj):
        if self.fail_update:
            return False, "shape mismatch"
        self.loaded.update(dict(pickle.loads(obj.serialized_named_tensors[0])))  # TP rank 0's entry
        return True, ""


class ProbingEngine(RecordingEngine):
    """sglang's ``Engine`` (checked): the post-sync probe gets exact log-probs (+ ``probe_gap``), other requests a
    scripted reply in sglang 0.5.23's shape."""

    def __init__(self, source, manager, probe_gap: float = 0.0):
        super().__init__(source, manager)
        self.probe_gap = probe_gap
        self.hold: asyncio.Event | None = None
        self.probe_logits = None

    async def reply(self, arguments):
        calls = self.tokenizer_manager.calls
        if arguments["logprob_start_len"] == 0:  # the post-sync probe: exact log-probs (+ probe_gap)
            calls.append("probe")
            ids = torch.tensor(arguments["input_ids"])
            lp = torch.log_softmax(self.probe_logits[0, :-1].float(), -1).gather(-1, ids[1:, None]).squeeze(-1)
            entries = [(None, int(ids[0]), None)] + [
                (float(v) + self.probe_gap, int(t), None) for v, t in zip(lp, ids[1:])
            ]
            return {
                "output_ids": [1],
                "meta_info": {"finish_reason": {"type": "length"}, "input_token_logprobs": entries},
            }
        calls.append(("generate", tuple(arguments["input_ids"])))
        if self.hold is not None:
            await self.hold.wait()
        return {
            "text": "x",
            "output_ids": [4, 7],
            "meta_info": {
                "finish_reason": {"type": "stop", "matched": 7},
                "prompt_tokens": len(arguments["input_ids"]),
            },
        }


@pytest.fixture
def engine_of(sglang_source):
    """``engine_of(fail_update=False, probe_gap=0.0)`` -> (``SGLangControl`` over a checked engine, the engine)."""

    def make(fail_update: bool = False, probe_gap: float = 0.0):
        engine = ProbingEngine(sglang_source, LoadingManager(sglang_source, fail_update), probe_gap)
        return SGLangControl(engine, sglang_source.io_struct, SourceSerializer(sglang_source)), engine

    return make


CFG = SimpleNamespace(
    actor=SimpleNamespace(group_name="ActorGroup"),
    runner=SimpleNamespace(max_staleness=0),
    rollout=SimpleNamespace(group_name="RolloutGroup", tensor_parallel_size=1, return_logprobs=False),
)


class FakeWorker(SGLangRolloutState):
    """The worker without Ray: ``receive_weights`` calls recv/send (paired) on it, checked against RLinf's
    ``Worker.recv``/``send`` (which answer with a work handle only for ``async_op=True``)."""

    def __init__(self, control, collocated: bool, messages=()):
        self._rank = 0
        self.inbox, self.acks = list(messages), 0
        self._setup(CFG, verify_sync=True, sync_atol=1e-3, collocated=collocated, distributed=False)
        self._attach(control, lambda ids: "".join(f"<{i}>" for i in ids), [7], SamplingParams(max_new_tokens=8))

    @checked_against(Worker.recv)
    def recv(self, src_group_name, src_rank, async_op=False, options=None):
        message = self.inbox.pop(0)
        return Op(message) if async_op else message

    @checked_against(Worker.send)
    def send(self, object, dst_group_name, dst_rank, async_op=False, options=None, piggyback_payload=None):
        assert object == SYNC_ACK
        self.acks += 1
        return Op() if async_op else None


def sync_messages(state, version=3):
    prepare_handles(torch.device("cpu"))
    buckets = buckets_of(state, max_bytes=64)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    header = SyncHeader(version=version, sender=0, probe_ids=ids, probe_logits=torch.randn(1, 5, 8))
    body = [share_bucket(b) for b in buckets]
    return [header] + body + [SYNC_END], header, len(buckets)


STATE = {
    "model.embed_tokens.weight": torch.arange(16.0).view(4, 4),
    "lm_head.weight": torch.ones(4, 4),
    "model.norm.weight": torch.full((4,), 2.0),
}


def run_sync(worker, route):
    asyncio.run(worker.set_weight_sync(route))
    return asyncio.run(worker._receive_and_load(3))


def test_collocated_order_release_then_weights_update_end_cache_flush_probe(engine_of):
    control, engine = engine_of()
    messages, header, n = sync_messages(STATE)
    engine.probe_logits = header.probe_logits
    w = FakeWorker(control, collocated=True, messages=messages)
    asyncio.run(w._release())  # end of init_worker (collocated): the actor initialises next
    asyncio.run(w._release())  # a second offload does nothing
    with pytest.raises(RuntimeError, match="memory is released"):
        asyncio.run(w._generate({"channel_key": "k", "prompt_ids": [1, 2]}))
    run_sync(w, SyncRoutes("paired", actor_world=1, rollout_dp=1))
    manager = engine.tokenizer_manager
    assert manager.calls == (
        [("release", None), ("resume", tuple(WEIGHTS_TAGS)), "begin"]
        + [("update", 1)] * n
        + ["end", ("resume", tuple(CACHE_TAGS)), "flush", "probe"]
    )  # tags None: release all
    assert WEIGHTS_TAGS == ["weights"] and CACHE_TAGS == ["kv_cache", "cuda_graph"]
    assert all(torch.equal(manager.loaded[k], v) for k, v in STATE.items()) and w.acks == n
    state = asyncio.run(w.get_state())
    assert state["weight_version"] == 3 and state["last_sync_logprob_gap"] < 1e-5 and not w.released


def test_a_disaggregated_engine_is_never_released(engine_of):
    control, engine = engine_of()
    w = FakeWorker(control, collocated=False)
    asyncio.run(w._release())  # the trainer offloads every step; a disaggregated engine keeps its GPUs
    assert engine.tokenizer_manager.calls == [] and not w.released


def test_no_release_with_requests_in_flight(engine_of):
    control, engine = engine_of()
    w = FakeWorker(control, collocated=True)

    async def go():
        engine.hold = asyncio.Event()
        pending = asyncio.create_task(w._generate({"channel_key": "k", "prompt_ids": [1, 2]}))
        await asyncio.sleep(0.01)
        with pytest.raises(RuntimeError, match="1 generate request"):
            await w._release()
        engine.hold.set()
        reply = await pending
        await w._release()  # idle now
        return reply

    reply = asyncio.run(go())
    assert reply["output_ids"] == [4, 7] and reply["finish_reason"] == "eos"
    assert engine.tokenizer_manager.calls == [("generate", (1, 2)), ("release", None)]


def test_a_failed_update_still_ends_the_session_and_resumes_the_cache(engine_of):
    control, engine = engine_of(fail_update=True)
    messages, header, _ = sync_messages(STATE)
    w = FakeWorker(control, collocated=True, messages=messages)
    asyncio.run(w._release())
    with pytest.raises(WeightSyncError, match="update_weights_from_tensor failed: shape mismatch"):
        run_sync(w, SyncRoutes("paired", actor_world=1, rollout_dp=1))
    assert engine.tokenizer_manager.calls == [
        ("release", None),
        ("resume", ("weights",)),
        "begin",
        ("update", 1),
        "end",
        ("resume", tuple(CACHE_TAGS)),
    ]  # no flush, no probe: the sync failed


def test_a_probe_mismatch_refuses_the_weights(engine_of):
    control, engine = engine_of(probe_gap=0.7)
    messages, header, _ = sync_messages(STATE)
    engine.probe_logits = header.probe_logits
    w = FakeWorker(control, collocated=False, messages=messages)
    with pytest.raises(WeightSyncError, match="differ from the actor's by 0.7"):
        run_sync(w, SyncRoutes("paired", actor_world=1, rollout_dp=1))


def test_serving_loop_sends_the_shared_reply_and_merges_the_config(engine_of):
    control, _ = engine_of()
    w = FakeWorker(control, collocated=False)

    async def go():
        inp, out = Channel(), Channel()
        for r in (
            {"channel_key": "a", "prompt_ids": [1, 2], "sampling_params": {"stop": ["</search>"]}},
            {"channel_key": "b", "prompt_ids": [3], "sampling_params": {"temprature": 1.0}},
            {"channel_key": STOP_SERVING},
        ):
            inp.queue.put_nowait(r)
        await w.rollout_serverless(inp, out)
        return out.items

    items = asyncio.run(go())
    assert items["a"] == {
        "output_ids": [4, 7],
        "text": "<4><7>",
        "finish_reason": "eos",
        "matched_stop": None,
        "logprobs": None,
        "num_generated": 2,
        "weight_version": 0,
    }  # the engine's first weights
    assert "unknown sampling params" in items["b"]["error"] and w.requests_served == 1


@pytest.mark.parametrize("k", [0, 1])
def test_a_request_carries_its_batch_priority_only_when_the_engine_schedules_by_it(engine_of, k):
    """k > 0: ``server_kwargs`` turns SGLang's priority scheduling on (lower first) and each request carries its
    batch's index, bound to sglang's ``async_generate``; at k = 0 none (SGLang may abort a priority it ignores)."""
    control, engine = engine_of()
    seen = []
    reply = engine.reply

    async def recording(arguments):
        seen.append(arguments["priority"])
        return await reply(arguments)

    engine.reply = recording
    w = FakeWorker(control, collocated=False)
    w.by_priority = k > 0  # what _setup reads from runner.max_staleness

    async def go():
        inp, out = Channel(), Channel()
        for r in (
            {"channel_key": "a", "prompt_ids": [1, 2], "sampling_params": {}, "priority": 4},
            {"channel_key": STOP_SERVING},
        ):
            inp.queue.put_nowait(r)
        await w.rollout_serverless(inp, out)

    asyncio.run(go())
    assert seen == ([4] if k else [None])


# ------------------------------------------------------------------------------------------------ flush before reopen
class FlushingManager(LoadingManager):
    """``LoadingManager`` whose ``flush_cache`` answers from ``replies`` (sglang's ``FlushCacheReqOutput`` fields;
    then success) and records, for each flush, whether the worker's gate still held new requests back and the
    ``timeout_s`` it was given."""

    def __init__(self, source, replies=()):
        super().__init__(source)
        self.replies = list(replies)
        self.worker = None
        self.flushes: list[tuple[bool, float | None]] = []

    async def flush_cache(self, *args, **kwargs):
        timeout_s = check_call(self.source, MANAGER, "TokenizerManager.flush_cache", self, *args, **kwargs).arguments[
            "timeout_s"
        ]
        self.flushes.append((self.worker.gate.paused, timeout_s))
        return await super().flush_cache(*args, **kwargs)

    async def on_flush_cache(self, obj):
        success, message = self.replies.pop(0) if self.replies else (True, "")
        return self.io.FlushCacheReqOutput(success=success, message=message)


def flushing_worker(sglang_source, replies=()):
    manager = FlushingManager(sglang_source, replies)
    engine = ProbingEngine(sglang_source, manager)
    control = SGLangControl(engine, sglang_source.io_struct, SourceSerializer(sglang_source))
    messages, header, _ = sync_messages(STATE)
    engine.probe_logits = header.probe_logits
    w = FakeWorker(control, collocated=True, messages=messages)
    manager.worker = w
    asyncio.run(w._release())
    return w, manager


def test_the_gate_reopens_only_after_a_successful_flush(sglang_source):
    """The flush runs while the gate still holds new requests back (SGLang refuses a flush with requests queued or
    running), with a timeout that lets SGLang wait for its scheduler to go idle; the gate reopens after it."""
    w, manager = flushing_worker(sglang_source)
    run_sync(w, SyncRoutes("paired", actor_world=1, rollout_dp=1))
    assert [paused for paused, _ in manager.flushes] == [True], manager.flushes
    assert all(timeout_s and timeout_s > 0 for _, timeout_s in manager.flushes), manager.flushes
    assert manager.calls[-2:] == ["flush", "probe"] and not w.gate.paused and w.weight_version == 3


def test_a_flush_that_fails_once_is_retried_and_the_sync_goes_on(sglang_source):
    busy = (False, "Timed out waiting for idle state.")  # sglang 0.5.23's deferred flush, still busy at its deadline
    w, manager = flushing_worker(sglang_source, [busy])
    run_sync(w, SyncRoutes("paired", actor_world=1, rollout_dp=1))
    assert [paused for paused, _ in manager.flushes] == [True, True], manager.flushes
    assert manager.calls[-3:] == ["flush", "flush", "probe"] and w.weight_version == 3 and not w.gate.paused


def test_a_flush_that_keeps_failing_stops_the_sync_with_a_clear_error(sglang_source):
    from rlinf_ext.workers.rollout_sglang import FLUSH_ATTEMPTS

    busy = (False, "Timed out waiting for idle state.")
    w, manager = flushing_worker(sglang_source, [busy] * FLUSH_ATTEMPTS)
    with pytest.raises(WeightSyncError) as raised:
        run_sync(w, SyncRoutes("paired", actor_world=1, rollout_dp=1))
    message = str(raised.value)
    assert f"{FLUSH_ATTEMPTS} attempts" in message and "Timed out waiting for idle state." in message, message
    assert len(manager.flushes) == FLUSH_ATTEMPTS and "probe" not in manager.calls
    assert not w.gate.paused  # serving goes on (on the new weights) until the run stops on the error
