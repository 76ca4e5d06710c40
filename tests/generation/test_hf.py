"""HFGenerator on the tiny Qwen2 model: engine-side stops, exact ids, batching of concurrent calls."""

import asyncio

import pytest
import torch

from rlinf_ext.generation.hf import HFGenerator, _Request, pick_batch
from rlinf_ext.protocol.generation import SamplingParams


@pytest.fixture(scope="module")
def generator(tiny_assets):
    return HFGenerator.from_pretrained(tiny_assets.qwen2_tiny, tiny_assets.tokenizer_dir, seed=0, return_logprobs=True)


def prompt(gen, text="Question: who wrote the book?\n"):
    return gen.tokenizer.encode(text, add_special_tokens=False)


def test_stop_string_cuts_exactly_after_completing_token(generator):
    generator.reseed(0)
    free = generator.generate_batch_sync([prompt(generator)], SamplingParams(max_new_tokens=40, stop=[]))[0]
    assert free.finish_reason in ("length", "eos")
    text = generator.tokenizer.decode(free.output_ids[:-1], skip_special_tokens=False)
    # a stop string that occurs in the free sample: the same seed and context must stop at/before it
    stop = text[len(text) // 2 : len(text) // 2 + 2] or text[-1]
    generator.reseed(0)
    result = generator.generate_batch_sync([prompt(generator)], SamplingParams(max_new_tokens=40, stop=[stop]))[0]
    assert result.finish_reason == "stop" and result.matched_stop == stop
    assert stop in result.text
    # nothing after the completing token: removing the last token loses the stop string
    shorter = generator.tokenizer.decode(result.output_ids[:-1], skip_special_tokens=False)
    assert stop not in shorter
    # the ids are the sampled ones: a prefix of the free-running sample (same seed)
    assert free.output_ids[: len(result.output_ids)] == result.output_ids
    assert result.text == generator.tokenizer.decode(result.output_ids, skip_special_tokens=False)
    assert len(result.logprobs) == len(result.output_ids) and all(lp <= 0 for lp in result.logprobs)


def test_length_and_greedy_determinism(generator):
    params = SamplingParams(max_new_tokens=5, do_sample=False, stop=[])
    a = generator.generate_batch_sync([prompt(generator)], params)[0]
    b = generator.generate_batch_sync([prompt(generator)], params)[0]
    assert a.output_ids == b.output_ids
    assert (a.finish_reason == "length" and len(a.output_ids) == 5) or a.finish_reason == "eos"


def test_eos_kept_and_nothing_after(generator):
    eos = sorted(generator.eos_ids)[0]

    # make EOS the overwhelmingly likely next token with a hook on the LM head
    def push_eos(module, inputs, logits):
        logits = logits.clone()
        logits[..., eos] += 1e4
        return logits

    hook = generator.model.lm_head.register_forward_hook(push_eos)
    try:
        result = generator.generate_batch_sync([prompt(generator)], SamplingParams(max_new_tokens=10, stop=["x"]))[0]
    finally:
        hook.remove()
    assert result.output_ids == [eos] and result.finish_reason == "eos"


def test_concurrent_calls_are_batched_and_each_cut_to_its_budget(generator):
    async def many():
        calls = [
            generator.generate(
                prompt(generator, f"Question {i}?\n"), SamplingParams(max_new_tokens=3 + i, do_sample=False)
            )
            for i in range(6)
        ]
        return await asyncio.gather(*calls)

    before = len(generator.batch_sizes)
    results = asyncio.run(many())
    assert max(generator.batch_sizes[before:]) > 1  # the concurrent calls shared model.generate calls
    for i, result in enumerate(results):
        assert len(result.output_ids) <= 3 + i
        # batched (left-padded) greedy output equals the same request alone
        alone = generator.generate_batch_sync(
            [prompt(generator, f"Question {i}?\n")], SamplingParams(max_new_tokens=3 + i, do_sample=False)
        )[0]
        assert alone.output_ids == result.output_ids


def test_pick_batch_serves_the_oldest_batch_first_then_arrival():
    greedy, sampled = SamplingParams(do_sample=False), SamplingParams()
    # arrival order a..e; priority = the batch's dispatch index
    a, b, c, d, e = (
        _Request([i], params, None, priority=p)
        for i, (params, p) in enumerate([(greedy, 2), (greedy, 1), (sampled, 0), (greedy, 1), (greedy, 0)])
    )
    # c (batch 0, sampled) heads the queue; e (batch 0) is greedy and cannot share its call
    assert pick_batch([a, b, c, d, e], 4) == [c]
    # without c: e (batch 0), then batch 1 in arrival order (b, d), then batch 2 (a); cut at the size
    assert pick_batch([a, b, d, e], 3) == [e, b, d]
    assert pick_batch([a, b, d, e], 8) == [e, b, d, a]
    assert pick_batch([a], 1) == [a]


def test_a_later_batch_queued_first_does_not_overtake_an_older_one(generator):
    """One request per ``model.generate``: the later batch's two requests reach the queue before the older batch's,
    and still wait for it."""
    served: list[int] = []
    run_batch = generator._run_batch

    def recording(batch):
        served.extend(r.priority for r in batch)
        return run_batch(batch)

    async def queued():
        params = SamplingParams(max_new_tokens=2, do_sample=False)
        calls = [
            generator.generate(prompt(generator, f"Question {i}?\n"), params, priority=p)
            for i, p in enumerate([3, 3, 2])
        ]
        return await asyncio.gather(*calls)

    size = generator.max_batch_size
    generator.max_batch_size, generator._run_batch = 1, recording
    try:
        asyncio.run(queued())
    finally:
        generator.max_batch_size = size
        del generator._run_batch
    assert served == [2, 3, 3]


def test_update_weights_changes_outputs_and_rejects_unknown(generator):
    name, param = next(iter(generator.model.named_parameters()))
    original = param.detach().clone()
    generator.update_weights([(name, torch.zeros_like(param))])
    assert torch.equal(dict(generator.model.named_parameters())[name], torch.zeros_like(param))
    generator.update_weights([(name, original)])
    with pytest.raises(KeyError, match="no parameter"):
        generator.update_weights([("nope.weight", original)])


def test_bad_requests(generator):
    with pytest.raises(ValueError, match="max_new_tokens"):
        asyncio.run(generator.generate([1, 2], SamplingParams(max_new_tokens=0)))
    with pytest.raises(ValueError, match="non-empty"):
        asyncio.run(generator.generate([], SamplingParams()))


def test_segments_cut_by_a_sync_join_into_one_turn_with_a_version_per_token(generator):
    """Partial rollout's join (pure over the segments): ids and log-probs as sampled, one version per token, and the
    end found on the joined ids, so a stop string that straddles the cut still ends the turn there."""
    from rlinf_ext.generation.hf import cut_by_sync
    from rlinf_ext.protocol.generation import GenerationResult

    tok = generator.tokenizer
    head = tok.encode(" the answer </sea", add_special_tokens=False)
    tail = tok.encode("rch> more words", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=40, stop=["</search>"])
    first = GenerationResult(head, tok.decode(head), "length", logprobs=[-0.5] * len(head))
    second = GenerationResult(tail, tok.decode(tail), "length", logprobs=[-1.5] * len(tail))
    assert cut_by_sync(first, 40) and not cut_by_sync(GenerationResult(head, "", "eos"), 40)
    assert not cut_by_sync(GenerationResult([1] * 40, "", "length"), 40)  # its own budget: not cut
    joined = generator.join_segments([(first, 3), (second, 4)], params)
    assert joined.finish_reason == "stop" and joined.matched_stop == "</search>"
    assert joined.text.endswith("</search>") and "more" not in joined.text
    n = len(joined.output_ids)
    assert len(head) < n < len(head) + len(tail) and joined.output_ids == (head + tail)[:n]
    assert joined.weight_version == [3] * len(head) + [4] * (n - len(head))
    assert joined.logprobs == [-0.5] * len(head) + [-1.5] * (n - len(head))
    one = generator.join_segments([(first, 3)], params.with_updates(max_new_tokens=len(head)))
    assert one.weight_version == 3 and one.finish_reason == "length"  # one version: one int, as before
    # a request still queued at the sync is cut before its first token: no ids, so no log-probs, and none missing
    queued = GenerationResult([], "", "length")
    late = generator.join_segments([(queued, 3), (second, 4)], params)
    assert late.logprobs == [-1.5] * len(tail) and late.weight_version == 4
