"""Weight sync without workers: who sends to whom, the buckets, handles opened by an unrelated process, the
streaming conversion and the HF loader's completeness check. With real RLinf workers:
tests/runner/test_weight_sync_routes.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from rlinf.scheduler import Worker
from transfer_fakes import Done

from rlinf_ext.convert.mapping import ConvertSpec
from rlinf_ext.convert.state_dicts import iter_megatron_to_hf, megatron_to_hf
from rlinf_ext.sync.weight_sync import (
    CastView,
    HandleBucket,
    HFWeightLoader,
    SyncRoutes,
    WeightSyncError,
    named_tensors_of,
    pack_buckets,
    prepare_handles,
    share_bucket,
    sync_mode,
)
from tests.support.signature_checks import checked_against


# ------------------------------------------------------------------------------------------------ routes
def test_paired_routes_give_each_engine_the_actor_ranks_on_its_gpus():
    tp1 = SyncRoutes("paired", actor_world=4, rollout_dp=4)
    assert [tp1.targets_of(r) for r in range(4)] == [[(0, 0)], [(1, 0)], [(2, 0)], [(3, 0)]]
    assert [tp1.sources_of(e) for e in range(4)] == [[0], [1], [2], [3]]
    tp2 = SyncRoutes("paired", actor_world=8, rollout_dp=4, rollout_tp=2)  # engine e spans GPUs 2e, 2e+1
    assert [tp2.targets_of(r) for r in range(8)] == [[(r // 2, r % 2)] for r in range(8)]
    assert tp2.sources_of(3) == [6, 7]


def test_broadcast_routes_send_from_actor_rank_zero_only():
    routes = SyncRoutes("broadcast", actor_world=4, rollout_dp=3, rollout_tp=2)
    assert routes.targets_of(0) == [(0, 0), (1, 0), (2, 0)]
    assert routes.targets_of(1) == routes.targets_of(3) == []
    assert routes.sources_of(2) == [0]
    groups, src = routes.broadcast_groups("Actor", "Rollout")
    assert groups == [("Actor", 0), ("Rollout", [0, 1, 2])] and src == ("Actor", 0)


def test_mode_follows_the_placement_and_paired_needs_one_actor_rank_per_rollout_gpu():
    assert sync_mode([0, 1, 2, 3], [0, 1, 2, 3]) == "paired"
    assert sync_mode([0, 1], [2, 3]) == "broadcast"
    with pytest.raises(WeightSyncError, match="3 actor ranks for 2 engine"):
        SyncRoutes("paired", actor_world=3, rollout_dp=2)


# ------------------------------------------------------------------------------------------------ buckets
def test_buckets_bound_the_bytes_keep_the_order_and_split_dtypes():
    state = {
        "a": torch.arange(10.0),
        "b": torch.arange(10.0) + 10,
        "c": torch.arange(30.0),
        "d": torch.arange(5.0),
        "e": torch.arange(4, dtype=torch.float16),
        "f": torch.arange(3.0),
    }  # fp32: 40/40/120/20 B
    buckets = list(pack_buckets(state.items(), max_bytes=80))
    assert [b.names for b in buckets] == [["a", "b"], ["c"], ["d"], ["e"], ["f"]]  # c alone (over 80), e a new dtype
    assert [b.flat.dtype for b in buckets] == [torch.float32] * 3 + [torch.float16, torch.float32]
    assert buckets[0].nbytes == 80 and buckets[0].flat.is_contiguous()
    rebuilt = {n: t for b in buckets for n, t in b.named_tensors()}
    assert list(rebuilt) == list(state) and all(torch.equal(rebuilt[k], v) for k, v in state.items())
    assert len(list(pack_buckets(state.items()))) == 3  # 1 GiB: one per dtype run


def test_handles_open_in_an_unrelated_process_without_copying_the_weights():
    """The CPU stand-in of CUDA IPC: a bucket in shared memory crosses as a few hundred bytes per tensor, and a
    fresh interpreter (not a child of this one: Ray's workers are not) maps the same memory."""
    prepare_handles(torch.device("cpu"))
    bucket = next(
        pack_buckets([("w", torch.arange(2 * 1024 * 256.0).view(1024, 512)), ("b", torch.ones(7))], shared=True)
    )
    message = share_bucket(bucket)
    assert isinstance(message, HandleBucket) and message.nbytes == bucket.nbytes == (1024 * 512 + 7) * 4
    assert message.wire_bytes < 2000 < bucket.nbytes
    script = textwrap.dedent("""
        import pickle, sys
        from rlinf_ext.sync.weight_sync import named_tensors_of
        named = dict(named_tensors_of(pickle.loads(sys.stdin.buffer.read())))
        print(float(named["w"].sum()), float(named["b"].sum()), tuple(named["w"].shape))
    """)
    import pickle

    out = (
        subprocess.run(
            [sys.executable, "-c", script], input=pickle.dumps(message), capture_output=True, check=True, timeout=120
        )
        .stdout.decode()
        .split()
    )
    assert float(out[0]) == float(bucket.named_tensors()[0][1].sum()) and float(out[1]) == 7.0
    assert " ".join(out[2:]) == "(1024, 512)"
    opened = dict(named_tensors_of(message))  # in-process too: the same memory, not a copy
    assert opened["w"].untyped_storage().data_ptr() != 0 and torch.equal(opened["b"], torch.ones(7))


# ------------------------------------------------------------------------------------------------ conversion
def test_streamed_conversion_equals_the_whole_state_conversion_and_casts_on_access(tiny_assets):
    from rlinf_ext.convert.hf_files import HFReader
    from rlinf_ext.convert.state_dicts import hf_to_megatron

    path = str(tiny_assets.qwen2_tiny)
    spec = ConvertSpec.from_hf_config(path, te_layernorm_names=False)
    mg = hf_to_megatron(HFReader(path).read_all(), spec)[(0, 0)]
    whole = megatron_to_hf({(0, 0): mg}, spec)
    streamed = list(iter_megatron_to_hf({(0, 0): CastView(mg, torch.device("cpu"), torch.bfloat16)}, spec))
    assert [n for n, _ in streamed] == list(whole)
    assert all(t.dtype == torch.bfloat16 and torch.equal(t, whole[n].to(torch.bfloat16)) for n, t in streamed)
    extra = dict(mg, **{"decoder.layers.0.unexpected.weight": torch.zeros(1)})
    with pytest.raises(Exception, match="not consumed"):
        list(iter_megatron_to_hf({(0, 0): extra}, spec))


def test_hf_loader_refuses_unknown_names_and_incomplete_syncs(tiny_assets):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_assets.qwen2_tiny)
    assert model.config.tie_word_embeddings  # the sync sends no lm_head then, and the loader does not ask for one
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    loader = HFWeightLoader(model)
    with pytest.raises(WeightSyncError, match="does not have"):
        loader.load([("model.nope.weight", torch.zeros(1))])
    first = list(state.items())[: len(state) // 2]
    loader.load(first)
    with pytest.raises(WeightSyncError, match="did not send"):
        loader.finish()
    loader.load(list(state.items())[len(state) // 2 :])
    loader.finish()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


# ------------------------------------------------------------------------------------------------ receiving
class ScriptedRollout:
    """A rollout worker's recv/send over scripted actor messages (no Ray): what receive_weights sees; checked
    against RLinf's ``Worker.recv``/``send``, answering with a work handle only for ``async_op=True`` as they do."""

    def __init__(self, rank: int, inbox: dict[int, list], log: list):
        self._rank, self.inbox, self.log = rank, inbox, log

    @checked_against(Worker.recv)
    def recv(self, src_group_name, src_rank, async_op=False, options=None):
        message = self.inbox[src_rank].pop(0)
        self.log.append(("recv", src_rank, type(message).__name__ if not isinstance(message, str) else message))
        return Done(message) if async_op else message

    @checked_against(Worker.send)
    def send(self, object, dst_group_name, dst_rank, async_op=False, options=None, piggyback_payload=None):
        self.log.append(("send", dst_rank, object))
        return Done() if async_op else None


def test_an_engine_of_tp2_loads_slot_by_slot_after_the_probe_and_acknowledges_each_bucket():
    import asyncio

    from rlinf_ext.sync.weight_sync import SYNC_ACK, SYNC_END, SyncHeader, receive_weights

    prepare_handles(torch.device("cpu"))
    routes = SyncRoutes("paired", actor_world=4, rollout_dp=2, rollout_tp=2)
    state = {"a": torch.ones(4), "b": torch.ones(4) * 2}

    def stream(sender):  # what actor rank `sender` sends: header, two buckets, end
        buckets = [share_bucket(b) for b in pack_buckets(state.items(), max_bytes=16, shared=True)]
        return [SyncHeader(version=7, sender=sender), *buckets, SYNC_END]

    log: list = []
    worker = ScriptedRollout(1, {2: stream(2), 3: stream(3)}, log)  # engine 1 = actor ranks 2 and 3
    loaded = []

    async def load(messages):
        log.append(("load", [m.names for m in messages]))
        loaded.append([dict(named_tensors_of(m)) for m in messages])

    async def on_header():
        log.append(("on_header",))

    headers, stats = asyncio.run(
        receive_weights(worker, routes, load, actor_group="A", rollout_group="R", on_header=on_header)
    )
    assert [h.sender for h in headers] == [2, 3] and headers[0].version == 7
    assert log[:3] == [("recv", 2, "SyncHeader"), ("recv", 3, "SyncHeader"), ("on_header",)]
    assert ("load", [["a"], ["a"]]) in log and ("load", [["b"], ["b"]]) in log
    assert [e for e in log if e[0] == "send"] == [("send", 2, SYNC_ACK), ("send", 3, SYNC_ACK)] * 2
    assert log[-2:] == [("recv", 2, SYNC_END), ("recv", 3, SYNC_END)]
    assert stats.buckets == 2 and stats.tensor_bytes == 32 and torch.equal(loaded[1][1]["b"], state["b"])

    broken = ScriptedRollout(0, {0: stream(0), 1: stream(1)[:2] + [SYNC_END]}, [])  # rank 1 stops early
    with pytest.raises(WeightSyncError, match="sent different buckets"):
        asyncio.run(receive_weights(broken, routes, load, actor_group="A", rollout_group="R"))


def test_a_paired_actor_frees_its_transfer_memory_before_the_end_of_the_sync(monkeypatch):
    # paired = the engine shares this GPU (collocated SGLang/HF): it maps its KV cache again on SYNC_END, so the
    # actor's cached blocks (the buckets, shared over CUDA IPC) go back to the driver before that message
    from rlinf_ext.sync.weight_sync import SYNC_ACK, SYNC_END, SyncHeader, send_weights
    from tests.support.host_cuda import HostCuda

    log: list = []
    HostCuda(log).install(monkeypatch.setattr)
    prepare_handles(torch.device("cpu"))

    class Actor:
        _rank = 0

        @checked_against(Worker.send)
        def send(self, object, dst_group_name, dst_rank, async_op=False, options=None, piggyback_payload=None):
            log.append(("send", object if isinstance(object, str) else type(object).__name__))

        @checked_against(Worker.recv)
        def recv(self, src_group_name, src_rank, async_op=False, options=None):
            return SYNC_ACK

    state = {"a": torch.ones(4), "b": torch.ones(4) * 2}
    buckets = pack_buckets(state.items(), max_bytes=16, shared=True)
    send_weights(
        Actor(),
        SyncRoutes("paired", actor_world=1, rollout_dp=1),
        SyncHeader(version=1, sender=0),
        buckets,
        actor_group="A",
        rollout_group="R",
    )
    assert log == [
        ("send", "SyncHeader"),
        ("send", "HandleBucket"),
        ("send", "HandleBucket"),
        ("cuda", "ipc_collect", 0),
        ("cuda", "empty_cache", 0),
        ("send", SYNC_END),
    ]


def test_a_late_answer_of_torchs_shared_memory_manager_is_retried(monkeypatch):
    # torch's shared-memory manager must answer a registration within 1 s (libshm's Socket::recv); a loaded host
    # can miss that, and the handle then opens on the next attempt. Other errors are not retried.
    from torch.multiprocessing import reductions

    from rlinf_ext.sync.weight_sync import SHM_MANAGER_ATTEMPTS, open_handle, retry_shm_manager, serialize_handle

    monkeypatch.setattr("rlinf_ext.sync.weight_sync.time.sleep", lambda s: None)
    prepare_handles(torch.device("cpu"))
    tensor = torch.arange(6.0).share_memory_()
    blob = serialize_handle(tensor)
    real, calls = reductions.rebuild_storage_filename, []

    @checked_against(real)
    def late_twice(cls, manager, handle, size, dtype=None):
        calls.append(handle)
        if len(calls) <= 2:
            raise RuntimeError("Shared memory manager connection has timed out")
        return real(cls, manager, handle, size, dtype)

    monkeypatch.setattr(reductions, "rebuild_storage_filename", late_twice)
    assert torch.equal(open_handle(blob), tensor) and len(calls) == 3

    def always(*args):
        raise RuntimeError("Shared memory manager connection has timed out")

    with pytest.raises(RuntimeError, match="timed out"):
        retry_shm_manager(always)
    tries = []

    def other():
        tries.append(1)
        raise RuntimeError("could not unlink the shared memory file")

    with pytest.raises(RuntimeError, match="unlink"):
        retry_shm_manager(other)
    assert len(tries) == 1 and SHM_MANAGER_ATTEMPTS == 5
