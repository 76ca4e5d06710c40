"""The CPU vision-language engine on the random tiny Qwen2.5-VL: batching, stops, banned ids, log-probs."""

from __future__ import annotations

import asyncio

import pytest
import torch
from vl_helpers import ForceTokens, chat_prompt_ids, mm_test_rows

from rlinf_ext.generation.hf import HFGenerator
from rlinf_ext.generation.hf_vl import HFVLGenerator
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.protocol.vl_tokens import banned_token_ids, mm_token_type_ids, vision_special_ids


@pytest.fixture(scope="module")
def vl(tiny_mm_assets):
    gen = HFVLGenerator.from_pretrained(tiny_mm_assets.mm.qwen2_5_vl_tiny, num_threads=None, return_logprobs=True)
    rows = mm_test_rows(tiny_mm_assets.mm, 4)
    return gen, rows


def _contexts(gen, rows):
    """Rows with 1 and 2 images and different lengths."""
    one = (chat_prompt_ids(gen.processor, rows[0].question, rows[0].images), rows[0].images)
    two_imgs = rows[1].images + rows[2].images
    two = (chat_prompt_ids(gen.processor, rows[1].question + " Compare them.", two_imgs), two_imgs)
    return [one, two]


def test_batched_equals_single_greedy(vl):
    gen, rows = vl
    params = SamplingParams(max_new_tokens=12, do_sample=False)

    async def batched():
        return await asyncio.gather(*(gen.generate(ids, params, images=imgs) for ids, imgs in _contexts(gen, rows)))

    together = asyncio.run(batched())
    assert gen.batch_sizes[-1] == 2
    alone = [asyncio.run(gen.generate(ids, params, images=imgs)) for ids, imgs in _contexts(gen, rows)]
    assert gen.batch_sizes[-1] == 1
    assert [r.output_ids for r in together] == [r.output_ids for r in alone]
    assert gen.images.hits > 0  # the second pass reused the preprocessed images


@pytest.mark.parametrize(
    "continuation,stop",
    [
        ("<reason> I should look at the image. </reason><search><img></search> never here", "</search>"),
        ("<reason> It is Drelia. </reason><text_search> Drelia founded </text_search> never here", "</text_search>"),
    ],
)
def test_stop_strings_for_both_search_tags(tiny_mm_assets, continuation, stop):
    rows = mm_test_rows(tiny_mm_assets.mm, 1)
    probe = HFVLGenerator.from_pretrained(tiny_mm_assets.mm.qwen2_5_vl_tiny, num_threads=None)
    ids = chat_prompt_ids(probe.processor, rows[0].question, rows[0].images)
    forced = probe.tokenizer.encode(continuation, add_special_tokens=False)
    gen = HFVLGenerator(probe.model, probe.processor, logits_processors=[ForceTokens(forced, len(ids))])
    params = SamplingParams(
        max_new_tokens=len(forced), do_sample=False, stop=["</search>", "</text_search>", "</answer>"]
    )
    result = asyncio.run(gen.generate(ids, params, images=rows[0].images))
    assert result.finish_reason == "stop" and result.matched_stop == stop
    assert result.text.endswith(stop) and "never" not in result.text
    assert result.output_ids == forced[: len(result.output_ids)]


def test_banned_ids_are_never_sampled(vl):
    gen, rows = vl
    banned = set(banned_token_ids(gen.tokenizer, gen.model.config.get_text_config().vocab_size))
    assert vision_special_ids(gen.tokenizer) <= banned and len(gen.tokenizer) in banned
    ids, imgs = _contexts(gen, rows)[0]
    params = SamplingParams(max_new_tokens=48, do_sample=True, temperature=1.5, top_k=-1)
    free = HFVLGenerator(gen.model, gen.processor, banned_ids=[], seed=3)
    guarded = HFVLGenerator(gen.model, gen.processor, seed=3)

    def sample(engine):
        async def run():
            return await asyncio.gather(*(engine.generate(ids, params, images=imgs) for _ in range(8)))

        return [t for r in asyncio.run(run()) for t in r.output_ids]

    assert banned & set(sample(free))  # the random model does sample them (so this test can fail)
    assert not banned & set(sample(guarded))


def test_logprobs_equal_a_forward_pass(vl):
    gen, rows = vl
    ids, imgs = _contexts(gen, rows)[1]
    params = SamplingParams(max_new_tokens=10, do_sample=True, temperature=0.7)
    result = asyncio.run(gen.generate(ids, params, images=imgs))
    full = torch.tensor([ids + result.output_ids])
    vision = gen.images.batch(imgs)
    with torch.no_grad():
        logits = (
            gen.model(
                input_ids=full,
                attention_mask=torch.ones_like(full),
                **vision,  # mrope positions:
                mm_token_type_ids=mm_token_type_ids(full, gen.image_pad_id),
            )
            .logits[0]
            .float()
        )
    logits = logits[len(ids) - 1 : full.shape[1] - 1] / 0.7
    logits[:, gen.banned_ids] = float("-inf")
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result.output_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-5)


def test_clear_errors_for_images(vl, tiny_mm_assets):
    gen, rows = vl
    ids = chat_prompt_ids(gen.processor, rows[0].question, rows[0].images)
    with pytest.raises(ValueError, match="need 8"):
        asyncio.run(gen.generate(ids, SamplingParams(max_new_tokens=2), images=rows[0].images * 2))
    with pytest.raises(TypeError, match="ImageRef"):
        asyncio.run(gen.generate(ids, SamplingParams(max_new_tokens=2), images=[b"png"]))
    text = HFGenerator(gen.model, gen.tokenizer)
    with pytest.raises(ValueError, match="HFVLGenerator"):
        asyncio.run(text.generate(ids, SamplingParams(max_new_tokens=2), images=rows[0].images))


def test_image_rows_get_mrope_positions_not_text_only(vl):
    """transformers 5 computes Qwen2.5-VL's 3-D positions only from `mm_token_type_ids`; without them a forward
    or `generate` silently uses text positions. Generation and the actor must both use the image positions."""
    from rlinf_ext.protocol.vl_tokens import mrope_positions

    gen, rows = vl
    ids, imgs = _contexts(gen, rows)[0]
    full = torch.tensor([ids])
    vision = gen.images.batch(imgs)
    positions = mrope_positions(gen.model, full, vision["image_grid_thw"], torch.ones_like(full))
    text_only = torch.arange(full.shape[1]).expand(3, 1, -1)
    assert positions.shape == (3, 1, full.shape[1]) and not torch.equal(positions, text_only)
    assert int(positions.max()) < full.shape[1] - 1  # an image's tokens share rows/columns: positions advance less
    with torch.no_grad():
        right = gen.model(input_ids=full, position_ids=positions, **vision).logits
        typed = gen.model(input_ids=full, **vision, mm_token_type_ids=mm_token_type_ids(full, gen.image_pad_id)).logits
        untyped = gen.model(input_ids=full, **vision).logits
    assert torch.allclose(right, typed, atol=1e-5)
    assert not torch.allclose(right, untyped, atol=1e-4)  # the silent fallback this guards against
    assert gen._model_inputs(full, vision)["mm_token_type_ids"].sum() == (full == gen.image_pad_id).sum()


def test_the_image_only_processor_round_trips_under_the_stock_name(vl, tmp_path):
    """transformers 5's Qwen2_5_VLProcessor requires a video processor, and video processors need torchvision
    (not installable beside the CPU torch): rlinf_ext's processor has none, expands image pads like the stock one
    and saves as `Qwen2_5_VLProcessor` so that the directory stays loadable wherever torchvision exists."""
    import json

    from rlinf_ext.generation.hf_vl import load_vl_processor
    from rlinf_ext.generation.vl_processor import ImageOnlyQwen2_5_VLProcessor

    gen, rows = vl
    processor = gen.processor
    assert isinstance(processor, ImageOnlyQwen2_5_VLProcessor) and not hasattr(processor, "video_processor")
    processor.save_pretrained(tmp_path)
    saved = {
        **json.loads((tmp_path / "processor_config.json").read_text()),
        **json.loads((tmp_path / "tokenizer_config.json").read_text()),
    }
    assert saved["processor_class"] == "Qwen2_5_VLProcessor"
    again = load_vl_processor(tmp_path)
    image = rows[0].images[0]
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q"}]}], add_generation_prompt=True
    )
    a = processor(text=[text], images=[image.to_pil()], return_tensors="pt")
    b = again(text=[text], images=[image.to_pil()], return_tensors="pt")
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.image_grid_thw, b.image_grid_thw)
    assert int((a.input_ids == gen.image_pad_id).sum()) == int(a.image_grid_thw.prod()) // 4
    assert torch.equal(a.mm_token_type_ids, mm_token_type_ids(a.input_ids, gen.image_pad_id))
