"""SGLang requests with images (pure functions) over the real tiny VL processor and tiny-world images."""

from __future__ import annotations

import pytest
from vl_helpers import chat_prompt_ids, mm_test_rows, text_positions_after_images

from rlinf_ext.generation.hf_vl import load_vl_processor
from rlinf_ext.generation.sglang_vl import (
    mm_request,
    retokenize_mismatch,
    vision_runs,
    vl_server_overrides,
)
from rlinf_ext.generation.sglang_wire import result_of_sglang
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.protocol.metric_keys import RETOKENIZE_MISMATCH
from rlinf_ext.protocol.vl_tokens import IMAGE_PAD, VISION_END, VISION_START, banned_token_ids
from tests.support.sglang_fakes import check_generate


@pytest.fixture(scope="module")
def vl(tiny_mm_assets):
    mm = tiny_mm_assets.mm
    processor = load_vl_processor(mm.processor_dir)
    tok = processor.tokenizer
    ids = tuple(tok.convert_tokens_to_ids(t) for t in (VISION_START, IMAGE_PAD, VISION_END))
    return processor, mm_test_rows(mm, 3), ids


def test_request_carries_every_image_in_order_and_the_banned_ids(vl, sglang_source):
    processor, rows, token_ids = vl
    images = rows[0].images + rows[1].images
    ids = chat_prompt_ids(processor, "Compare.", images)
    banned = banned_token_ids(processor.tokenizer, 448)
    req = mm_request(
        ids,
        images,
        {"max_new_tokens": 8, "stop": ["</search>"]},
        token_ids=token_ids,
        banned_ids=banned,
        logit_processor="serialised",
    )
    assert req["input_ids"] == ids and req["image_data"] == [images[0].data, images[1].data]
    assert req["sampling_params"]["custom_params"] == {"token_ids": sorted(banned)}
    assert req["custom_logit_processor"] == "serialised" and req["sampling_params"]["stop"] == ["</search>"]
    sent = check_generate(sglang_source, None, **req)  # sglang 0.5.23's Engine.async_generate and SamplingParams
    assert sent["image_data"] == req["image_data"] and sent["custom_logit_processor"] == "serialised"
    runs = vision_runs(ids, *token_ids)
    assert len(runs) == 2 and all(ids[a + 1 : b - 1].count(token_ids[1]) == 4 for a, b in runs)
    after = text_positions_after_images(ids, token_ids)
    assert after[0] == runs[-1][1] and after[-1] == len(ids) - 1


@pytest.mark.slow  # ~5 s: a child process imports sglang
def test_sglangs_own_processor_bans_the_ids_the_request_carries(vl, sglang_source):
    """The banned ids travel as ``custom_params`` (``mm_request``); sglang's scheduler loads the request's processor
    (``disallowed_tokens_processor()``, rlinf_ext's own, run beside sglang) with ``CustomLogitProcessor.from_str``
    and calls it with every row's ``custom_params``: exactly those ids become -inf, in every row."""
    processor, rows, token_ids = vl
    vocab = max(448, len(processor.tokenizer))  # the logits' width: the engine's vocabulary rows (vl_request_parts)
    banned = banned_token_ids(processor.tokenizer, vocab)
    ids = chat_prompt_ids(processor, "Q", rows[0].images)
    req = mm_request(
        ids,
        rows[0].images,
        {"max_new_tokens": 4},
        token_ids=token_ids,
        banned_ids=banned,
        logit_processor="(serialised in the child)",
    )
    masked = sglang_source.probe(
        {"banned": {"custom_params": req["sampling_params"]["custom_params"], "vocab": vocab, "rows": 2}}
    )["banned"]
    assert masked == [sorted(banned)] * 2 and len(banned) > 0


def test_request_errors_name_the_problem(vl):
    processor, rows, token_ids = vl
    ids = chat_prompt_ids(processor, "Q", rows[0].images)
    with pytest.raises(ValueError, match="1 image run.*2 image"):
        mm_request(ids, rows[0].images + rows[1].images, {}, token_ids=token_ids)
    with pytest.raises(ValueError, match="DisallowedTokensLogitsProcessor"):
        mm_request(ids, rows[0].images, {}, token_ids=token_ids, banned_ids=[1])
    broken = [token_ids[0], token_ids[1], 5]
    with pytest.raises(ValueError, match="malformed image run at position 0"):
        vision_runs(broken, *token_ids)
    text_only = mm_request([1, 2, 3], [], {"max_new_tokens": 1}, token_ids=token_ids)
    assert "image_data" not in text_only and "custom_logit_processor" not in text_only


def test_reply_parsing_and_retokenize_mismatch(vl):
    processor, rows, token_ids = vl
    ids = chat_prompt_ids(processor, "Q", rows[0].images)
    out = processor.tokenizer.encode("<reason> x </reason><search><img></search>", add_special_tokens=False)
    result = {
        "output_ids": out,
        "meta_info": {"finish_reason": {"type": "stop", "matched": "</search>"}, "prompt_tokens": len(ids)},
    }
    params = SamplingParams(stop=["</search>", "</answer>"])
    got = result_of_sglang(result, processor.tokenizer.decode, params, [processor.tokenizer.eos_token_id])
    assert got.matched_stop == "</search>" and got.text.endswith("<search><img></search>")
    assert retokenize_mismatch(ids, result["meta_info"]) == 0.0
    assert retokenize_mismatch(ids, {"prompt_tokens": len(ids) + 1}) == 1.0
    with pytest.raises(ValueError, match="prompt_tokens"):
        retokenize_mismatch(ids, {})
    assert RETOKENIZE_MISMATCH == "rollout/retokenize_mismatch"
    assert vl_server_overrides("qwen2.5_vl") == {
        "disable_fast_image_processor": True,
        "enable_custom_logit_processor": True,
    }
    assert vl_server_overrides("qwen2.5") == {}
