"""The vLLM rollout worker's logic on CPU without Ray: the serving loop over fake channels (the same replies as
the generator), and the weight-sync receive side fed by the real ``sync/weight_sync.py`` paired route (shared-
memory handle buckets, acknowledgements, ``SYNC_END``) with the probe check; GPU routes: call order against a
recording engine."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from rlinf_ext.generation.vllm_engine import VLLMEngineOptions, VLLMGenerator, VLLMGpuSync  # noqa: E402
from rlinf_ext.protocol.generation import STOP_SERVING, SamplingParams  # noqa: E402
from rlinf_ext.sync.weight_sync import (  # noqa: E402
    SYNC_ACK,
    SYNC_END,
    SyncHeader,
    SyncRoutes,
    WeightSyncError,
    pack_buckets,
    prepare_handles,
    share_bucket,
)
from rlinf_ext.workers.rollout_vllm import VLLMRolloutState  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class Op:
    def __init__(self, value=None, coro=None):
        self.value, self.coro = value, coro

    async def async_wait(self):
        return await self.coro if self.coro is not None else self.value


class Channel:
    def __init__(self):
        self.queue: asyncio.Queue | None = None
        self.items: dict = {}

    def get(self, async_op=True):
        return Op(coro=self.queue.get())

    def put(self, item, key=None, async_op=True):
        self.items[key] = item
        return Op()


class FakeTransport(VLLMRolloutState):
    """What ``receive_weights`` calls on the worker (paired route: recv from the actor, send acknowledgements)."""

    def __init__(self, messages):
        self._rank = 0
        self.inbox = list(messages)
        self.acks = 0

    def recv(self, group, src, async_op=True):
        return Op(self.inbox.pop(0))

    def send(self, obj, group, dst, async_op=True):
        assert obj == SYNC_ACK
        self.acks += 1
        return Op()


@pytest.fixture(scope="module")
def model_dirs(qwen2_head32_dirs):
    return qwen2_head32_dirs


@pytest.fixture(scope="module")
def generator(model_dirs):
    gen = VLLMGenerator.start(VLLMEngineOptions(model_path=str(model_dirs[0]), max_model_len=512,
                                                kv_cache_memory_bytes=32 << 20, max_num_seqs=16))
    yield gen
    gen.shutdown()


CFG = SimpleNamespace(actor=SimpleNamespace(group_name="ActorGroup"), rollout=SimpleNamespace(group_name="RolloutGroup"))


def worker(generator, messages=()):
    w = FakeTransport(messages)
    w._setup(CFG, verify_sync=True, sync_atol=1e-3)
    w._attach(generator, SamplingParams(max_new_tokens=6, do_sample=False))
    return w


def test_serving_loop_answers_every_request_and_stops(generator):
    w = worker(generator)
    tok = generator.tokenizer
    reqs = [{"channel_key": f"k{i}", "prompt_ids": tok.encode(f"Question {i}?\n", add_special_tokens=False),
             "sampling_params": {"max_new_tokens": 3 + i}, "seed": i} for i in range(4)]
    reqs.append({"channel_key": "bad", "prompt_ids": [], "sampling_params": {}})

    async def go():
        inp, out = Channel(), Channel()
        inp.queue = asyncio.Queue()
        for r in reqs + [{"channel_key": STOP_SERVING}]:
            inp.queue.put_nowait(r)
        await w.rollout_serverless(inp, out)
        alone = [await generator.generate(r["prompt_ids"], SamplingParams(max_new_tokens=3 + i, do_sample=False))
                 for i, r in enumerate(reqs[:4])]
        return out.items, alone

    items, alone = asyncio.run(go())
    for i, ref in enumerate(alone):
        reply = items[f"k{i}"]
        assert reply["output_ids"] == ref.output_ids and reply["finish_reason"] == ref.finish_reason
        assert set(reply) == {"output_ids", "text", "finish_reason", "matched_stop", "logprobs", "num_generated"}
    assert "error" in items["bad"] and w.requests_served == 4


def sync_messages(state: dict, probe_model=None, version=3, bucket_bytes=16 << 10):
    prepare_handles(torch.device("cpu"))
    buckets = [share_bucket(b) for b in pack_buckets(state.items(), max_bytes=bucket_bytes, shared=True)]
    vocab = state["model.embed_tokens.weight"].shape[0]
    ids = torch.randint(0, min(500, vocab), (1, 12), generator=torch.Generator().manual_seed(0))
    logits = None
    if probe_model is not None:
        with torch.no_grad():
            logits = probe_model(input_ids=ids).logits.float()

    return [SyncHeader(version=version, sender=0, probe_ids=ids, probe_logits=logits)] + buckets + [SYNC_END], buckets


def test_weight_sync_paired_route_loads_and_checks_probe(generator, model_dirs):
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(str(model_dirs[1]), dtype=torch.float32).eval()
    messages, buckets = sync_messages(dict(new.state_dict()), probe_model=new)
    assert len(buckets) > 3
    w = worker(generator, messages)
    asyncio.run(w.set_weight_sync(SyncRoutes("paired", actor_world=1, rollout_dp=1)))
    asyncio.run(w._receive_and_load())
    state = asyncio.run(w.get_state())
    assert state["weight_version"] == 3 and state["last_sync_logprob_gap"] < 1e-4
    assert state["last_sync"]["buckets"] == len(buckets) == w.acks
    print(f"vLLM sync of {len(buckets)} buckets: {state['last_sync']['load_s'] * 1000:.0f} ms")

    # a sync whose weights do not reproduce the actor's probe is refused (here: the actor is the old model)
    other = AutoModelForCausalLM.from_pretrained(str(model_dirs[0]), dtype=torch.float32)  # the engine's first weights
    messages, _ = sync_messages(dict(new.state_dict()), probe_model=other.eval(), version=4)
    w = worker(generator, messages)
    asyncio.run(w.set_weight_sync(SyncRoutes("paired", actor_world=1, rollout_dp=1)))
    with pytest.raises(WeightSyncError, match="probe log-probs"):
        asyncio.run(w._receive_and_load())
    # serving resumed after the refused sync
    out = asyncio.run(generator.generate([5, 6, 7], SamplingParams(max_new_tokens=2, do_sample=False)))
    assert len(out.output_ids) >= 1


class Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        async def record(*args, **kwargs):
            self.calls.append(name if name not in ("wake_up", "sleep") else (name, kwargs.get("tags", kwargs.get("level"))))
        return record


def test_gpu_collocated_route_call_order():
    eng = Recorder()
    sync = VLLMGpuSync(eng, "ipc", gpu_uuid="GPU-0")
    fake_reduce = lambda t: (None, ("args", tuple(t.shape)))  # noqa: E731
    import rlinf_ext.generation.vllm_engine as ve

    async def go():
        await sync.after_rollout()
        await sync.begin()
        orig = ve.ipc_update_info
        ve.ipc_update_info = lambda named, uuid: orig(named, uuid, reduce_tensor=fake_reduce)
        try:
            await sync.load_bucket([("a", torch.zeros(2, 3))])
        finally:
            ve.ipc_update_info = orig
        await sync.finish()
        await sync.begin()  # the second sync does not initialise the transfer engine again
    asyncio.run(go())
    assert eng.calls[:7] == [("sleep", 2), ("wake_up", ["weights"]), "init_weight_transfer_engine",
                             "start_weight_update", "update_weights", "finish_weight_update", ("wake_up", ["kv_cache"])]
    assert eng.calls[7:] == ["reset_prefix_cache", "reset_encoder_cache", "resume_generation", "pause_generation",
                             "start_weight_update"]
    info = ve.ipc_update_info([("a", torch.zeros(2, 3))], "GPU-0", reduce_tensor=fake_reduce)
    assert info == {"names": ["a"], "dtype_names": ["float32"], "shapes": [[2, 3]], "ipc_handles": [{"GPU-0": ("args", (2, 3))}]}


def test_gpu_disaggregated_route_call_order():
    eng = Recorder()
    sync = VLLMGpuSync(eng, "nccl", init_info={"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 2})

    async def go():
        await sync.after_rollout()  # no sleep: the engine owns its GPUs
        await sync.begin()
        await sync.load_bucket([("a", torch.zeros(2))])
        await sync.finish()
    asyncio.run(go())
    assert eng.calls == ["pause_generation", "init_weight_transfer_engine", "start_weight_update", "update_weights",
                         "finish_weight_update", "reset_prefix_cache", "reset_encoder_cache", "resume_generation"]


def test_processes_that_start_vllm_do_not_load_numba():
    """vLLM's CPU engine start fails once llvmlite (numba, via bm25s) is loaded in its process: the rollout
    worker, the launcher and the evaluation runner must not import it."""
    import subprocess
    import sys

    code = ("import sys, rlinf_ext.workers.rollout_vllm, rlinf_ext.runner.launch, rlinf_ext.eval.searchr1.runner; "
            "print(sorted(m for m in ('numba', 'llvmlite', 'bm25s') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
