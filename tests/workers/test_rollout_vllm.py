"""The vLLM rollout worker's logic on CPU without Ray: the serving loop over fake channels (the same replies as
the generator), and the weight-sync receive side fed by the real ``sync/weight_sync.py`` paired route (shared-
memory handle buckets, acknowledgements, ``SYNC_END``) with the probe check; the GPU engines' options (the GPU
routes' call order: tests/sync/test_vllm_transfer.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from channel_fakes import Channel, Op  # noqa: E402
from rlinf.scheduler import Worker as RLinfWorker  # noqa: E402

from rlinf_ext.generation.vllm_engine import VLLMGenerator  # noqa: E402
from rlinf_ext.generation.vllm_wire import VLLMEngineOptions  # noqa: E402
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
from tests.support.signature_checks import bind_like  # noqa: E402
from tests.support.vllm_hold import HeldAfter  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: a vLLM engine start


class FakeTransport(VLLMRolloutState):
    """What ``receive_weights`` calls on the worker (paired route: recv from the actor, send acknowledgements),
    each call bound to the installed RLinf ``Worker`` method."""

    def __init__(self, messages):
        self._rank = 0
        self.inbox = list(messages)
        self.acks = 0

    def recv(self, group, src, async_op=True):
        bind_like(RLinfWorker.recv, self, group, src, async_op=async_op)
        return Op(self.inbox.pop(0))

    def send(self, obj, group, dst, async_op=True):
        bind_like(RLinfWorker.send, self, obj, group, dst, async_op=async_op)
        assert obj == SYNC_ACK
        self.acks += 1
        return Op()


@pytest.fixture(scope="module")
def model_dirs(qwen2_head32_dirs):
    return qwen2_head32_dirs


@pytest.fixture(scope="module")
def generator(model_dirs):
    gen = VLLMGenerator.start(
        VLLMEngineOptions(
            model_path=str(model_dirs[0]), max_model_len=512, kv_cache_memory_bytes=32 << 20, max_num_seqs=16
        )
    )
    yield gen
    gen.shutdown()


CFG = SimpleNamespace(
    actor=SimpleNamespace(group_name="ActorGroup"),
    rollout=SimpleNamespace(group_name="RolloutGroup"),
    runner=SimpleNamespace(partial_rollout=False),
)


def worker(generator, messages=()):
    w = FakeTransport(messages)
    w._setup(CFG, verify_sync=True, sync_atol=1e-3)
    w._attach(generator, SamplingParams(max_new_tokens=6, do_sample=False))
    return w


def test_serving_loop_answers_every_request_and_stops(generator):
    w = worker(generator)
    tok = generator.tokenizer
    reqs = [
        {
            "channel_key": f"k{i}",
            "prompt_ids": tok.encode(f"Question {i}?\n", add_special_tokens=False),
            "sampling_params": {"max_new_tokens": 3 + i},
            "seed": i,
        }
        for i in range(4)
    ]
    reqs.append({"channel_key": "bad", "prompt_ids": [], "sampling_params": {}})

    async def go():
        inp, out = Channel(), Channel()
        inp.queue = asyncio.Queue()
        for r in reqs + [{"channel_key": STOP_SERVING}]:
            inp.queue.put_nowait(r)
        await w.rollout_serverless(inp, out)
        alone = [
            await generator.generate(r["prompt_ids"], SamplingParams(max_new_tokens=3 + i, do_sample=False))
            for i, r in enumerate(reqs[:4])
        ]
        return out.items, alone

    items, alone = asyncio.run(go())
    for i, ref in enumerate(alone):
        reply = items[f"k{i}"]
        assert reply["output_ids"] == ref.output_ids and reply["finish_reason"] == ref.finish_reason
        assert set(reply) == {
            "output_ids",
            "text",
            "finish_reason",
            "matched_stop",
            "logprobs",
            "num_generated",
            "weight_version",
        }
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
    parts = asyncio.run(w._receive_and_load(3))
    state = asyncio.run(w.get_state())
    assert state["weight_version"] == 3 and state["last_sync_logprob_gap"] < 1e-4
    assert state["last_sync"]["buckets"] == len(buckets) == w.acks
    assert set(parts) == {"header_wait", "load", "probe"} and all(v >= 0 for v in parts.values())
    assert parts["load"] >= state["last_sync"]["load_s"]  # the load part holds the engine's own load time
    print(f"vLLM sync of {len(buckets)} buckets: {state['last_sync']['load_s'] * 1000:.0f} ms; parts {parts}")

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


def test_a_sync_waits_for_the_turn_in_flight_and_vllm_labels_each_reply(generator, model_dirs):
    """vLLM's own weight-version label on the replies: a sync requested while a turn is being generated pauses in
    wait mode (the turn finishes on the old weights: the old greedy ids, one label), a turn asked for during the sync
    waits and gets the new weights under the driver's version."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(str(model_dirs[0]), dtype=torch.float32).eval()
    messages, _ = sync_messages(dict(target.state_dict()), probe_model=target)
    w = worker(generator, messages)
    asyncio.run(w.set_weight_sync(SyncRoutes("paired", actor_world=1, rollout_dp=1)))
    long = {"max_new_tokens": 24}
    request = {"channel_key": "k", "prompt_ids": [5, 9, 11, 13, 17], "sampling_params": long, "seed": 1}
    engine = generator.engine

    async def go():
        await w._label_initial_weights()
        old = await w._generate(request)
        in_flight = asyncio.create_task(w._generate(request))
        while not engine._waiting:
            await asyncio.sleep(0.001)
        sync = asyncio.create_task(w._receive_and_load(5))
        while not engine._paused:
            await asyncio.sleep(0.001)
        running_at_pause = bool(engine._waiting) and not in_flight.done()
        during = asyncio.create_task(w._generate(request))
        first, second = await in_flight, await during
        await sync
        return old, first, second, running_at_pause

    old, first, second, running_at_pause = asyncio.run(go())
    assert running_at_pause  # the sync began while the turn ran
    assert old["weight_version"] == first["weight_version"] == 0 and first["output_ids"] == old["output_ids"]
    assert second["weight_version"] == 5 == w.weight_version and second["output_ids"] != old["output_ids"]


def test_a_hung_turn_times_the_syncs_pause_out_and_vllm_serves_again(generator, model_dirs):
    """CPU route: a turn whose engine steps hang (the step thread cannot take the engine's lock) while a sync lands:
    vLLM's pause gives up after the worker's timeout with an error naming this rollout rank and the stuck request's
    channel key, instead of blocking the run; generation is resumed (not left paused), and the turn, once unstuck,
    finishes on the old weights."""
    messages, _ = sync_messages({"model.embed_tokens.weight": torch.zeros(4, 4)})  # the header is all it reads
    w = worker(generator, messages)
    w.sync_timeout_s = 0.5
    asyncio.run(w.set_weight_sync(SyncRoutes("paired", actor_world=1, rollout_dp=1)))
    request = {
        "channel_key": "uid-stuck",
        "prompt_ids": [5, 9, 11, 13, 17],
        "sampling_params": {"max_new_tokens": 200},
        "seed": 1,
    }
    engine = generator.engine

    async def go():
        await w._label_initial_weights()
        in_flight = asyncio.create_task(w._generate(request))
        while not engine._waiting:
            await asyncio.sleep(0.001)
        engine._lock.acquire()  # the next engine step waits: the turn hangs in flight
        try:
            assert engine._waiting, "the turn finished before it could be held"
            with pytest.raises(WeightSyncError) as raised:
                try:
                    await asyncio.wait_for(w._receive_and_load(5), 10)
                except TimeoutError:
                    raise AssertionError("the sync still waits for the hung turn after 10 s") from None
            paused_after = engine._paused
        finally:
            engine._lock.release()
        return str(raised.value), paused_after, await asyncio.wait_for(in_flight, 60)

    message, paused_after, reply = asyncio.run(go())
    assert "rank 0" in message and "uid-stuck" in message and "0.5 s" in message, message
    assert not paused_after and w.weight_version == 0
    assert reply["weight_version"] == 0 and len(reply["output_ids"]) >= 1


def test_with_partial_rollout_a_sync_cuts_the_turn_in_flight_which_goes_on_under_the_new_version(generator, model_dirs):
    """``runner.partial_rollout``: the sync does not wait for the turn in flight; vLLM's keep pause stops it after its
    4th token, the weights are loaded and checked by the probe, and the turn goes on: its reply carries version 0 for
    the 4 tokens the old weights sampled (the ids of the turn without a sync), the driver's version 5 for the rest."""
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(str(model_dirs[1]), dtype=torch.float32).eval()
    messages, _ = sync_messages(dict(new.state_dict()), probe_model=new)
    w = worker(generator, messages)
    w.partial = True
    asyncio.run(w.set_weight_sync(SyncRoutes("paired", actor_world=1, rollout_dp=1)))
    request = {
        "channel_key": "k",
        "prompt_ids": [5, 9, 11, 13, 17],
        "sampling_params": {"max_new_tokens": 24},
        "seed": 1,
    }
    n = 4

    async def go():
        await w._label_initial_weights()
        old = await w._generate(request)
        held = HeldAfter(generator.engine, n)
        try:
            turn = asyncio.create_task(w._generate(request))
            while not held.reached:
                await asyncio.sleep(0.001)
            sync = asyncio.create_task(w._receive_and_load(5))
            while not generator.engine._kept:
                await asyncio.sleep(0.001)
        finally:
            held.release()
        await sync
        return old, await turn

    old, cut = asyncio.run(go())
    assert len(old["output_ids"]) > n + 1, "the turn ends before the sync could cut it"
    assert cut["output_ids"][:n] == old["output_ids"][:n]
    assert cut["weight_version"] == [0] * n + [5] * (len(cut["output_ids"]) - n) and w.weight_version == 5
    assert w.last_sync_logprob_gap < 1e-4 and not generator.engine._paused


def test_a_keep_pause_cut_short_by_the_timeout_still_leaves_vllm_serving(generator, model_dirs):
    """Partial rollout with the engine's step stuck longer than the worker's timeout (another thread holds the engine's
    lock for 1.5 s): the sync fails naming this rank, and vLLM's scheduler is resumed only after the keep pause that
    the timeout cut short has landed, so it is not left paused: the turn finishes on the old weights' label."""
    import threading
    import time

    messages, _ = sync_messages({"model.embed_tokens.weight": torch.zeros(4, 4)})  # the header is all it reads
    w = worker(generator, messages)
    w.partial, w.sync_timeout_s = True, 0.3
    asyncio.run(w.set_weight_sync(SyncRoutes("paired", actor_world=1, rollout_dp=1)))
    request = {
        "channel_key": "uid-stuck",
        "prompt_ids": [5, 9, 11, 13, 17],
        "sampling_params": {"max_new_tokens": 64},
        "seed": 1,
    }
    engine = generator.engine
    held, release = threading.Event(), threading.Event()

    def hold():
        with engine._lock:
            held.set()
            release.wait(1.5)

    async def go():
        await w._label_initial_weights()
        in_flight = asyncio.create_task(w._generate(request))
        while not engine._waiting:
            await asyncio.sleep(0.001)
        threading.Thread(target=hold, daemon=True).start()
        while not held.is_set():
            await asyncio.sleep(0.001)
        t0 = time.perf_counter()
        with pytest.raises(WeightSyncError) as raised:
            await asyncio.wait_for(w._receive_and_load(5), 30)
        return str(raised.value), time.perf_counter() - t0, await asyncio.wait_for(in_flight, 60)

    message, took, reply = asyncio.run(go())
    assert "rank 0" in message and "0.3 s" in message, message
    assert not engine._paused and not engine._kept and not engine._core().is_scheduler_paused()
    assert reply["weight_version"] == 0 and len(reply["output_ids"]) >= 1 and w.weight_version == 0
    print(f"the failed keep pause returned after {took:.2f} s")


def test_gpu_engine_options_follow_the_placement(qwen2_head32_dirs):
    """GPU engines: sleep mode and vLLM's ipc transfer when collocated, nccl without sleep mode when apart; the
    CPU engine needs neither (in-place reload). Log-probs after temperature on every engine; helper ops eager on CPU."""
    from rlinf_ext.config import load_config
    from rlinf_ext.generation.vllm_wire import (
        ALLOW_PICKLED_CALLS_ENV,
        LOGPROBS_MODE,
        engine_args,
        engine_environment,
        options_from_config,
    )

    path = f"rollout.model.model_path={qwen2_head32_dirs[0]}"
    collocated = load_config("tiny-cpu", [path, "rollout.rollout_backend=vllm"], strict=False)
    collocated.cluster.num_gpus_per_node = 8
    collocated.cluster.component_placement = {"actor,rollout,reward": "all"}
    apart = load_config("tiny-cpu", [path, "rollout.rollout_backend=vllm"], strict=False)
    apart.cluster.num_gpus_per_node = 8
    apart.cluster.component_placement = {"actor": "0-3", "rollout,reward": "4-7"}
    on = engine_args(options_from_config(collocated, cuda=True))
    assert on["enable_sleep_mode"] and on["weight_transfer_config"] == {"backend": "ipc"}
    # the collocated engine starts allowing pickled engine-core calls (its CUDA-IPC update info), no other one
    assert engine_environment(options_from_config(collocated, cuda=True)) == {ALLOW_PICKLED_CALLS_ENV: "1"}
    off = engine_args(options_from_config(apart, cuda=True))
    assert "enable_sleep_mode" not in off and off["weight_transfer_config"] == {"backend": "nccl"}
    assert engine_environment(options_from_config(apart, cuda=True)) == {}
    cpu = engine_args(options_from_config(collocated, cuda=False))
    assert "enable_sleep_mode" not in cpu and "weight_transfer_config" not in cpu
    assert on["logprobs_mode"] == off["logprobs_mode"] == cpu["logprobs_mode"] == LOGPROBS_MODE == "processed_logprobs"
    # helper ops eager only on CPU (on GPUs their compiled kernels are worth the build)
    assert options_from_config(collocated, cuda=False).eager_helper_ops
    assert not options_from_config(collocated, cuda=True).eager_helper_ops


def test_processes_that_start_vllm_do_not_load_numba():
    """vLLM's CPU engine start fails once llvmlite (numba, via bm25s) is loaded in its process: the rollout
    worker, the launcher and the evaluation runner must not import it."""
    import subprocess
    import sys

    code = (
        "import sys, rlinf_ext.workers.rollout_vllm, rlinf_ext.runner.launch, rlinf_ext.eval.searchr1.runner; "
        "print(sorted(m for m in ('numba', 'llvmlite', 'bm25s') if m in sys.modules), flush=True); "
        "import os; os._exit(0)"  # no teardown of what it loaded
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
