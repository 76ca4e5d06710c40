"""SGLang 0.5.23 requests with images (pure functions; the engine needs a GPU, NOT GPU-verified).

What SGLang does with a multimodal request (read from sglang 0.5.23's
``sglang/srt/multimodal/processors/base_processor.py:load_mm_data`` and ``qwen_vl.py``): every turn is a new
request carrying the whole context ids and EVERY image so far, in order of appearance (raw bytes: ``image_data``);
SGLang decodes the ids to text, takes each ``<|vision_start|>(<|image_pad|>)+<|vision_end|>`` run as one image
(Qwen-VL's ``image_token_regex``), and re-tokenises with the processor. So the ids must hold exactly one vision run
per image, and the engine's prompt may differ from the agent loop's ids when they are not canonical
(``retokenize_mismatch`` counts that). Banned ids (vision special tokens, padded vocabulary rows) are refused at
sampling with SGLang's ``DisallowedTokensLogitsProcessor`` (every request of a batch must carry the same list).
"""

from __future__ import annotations

from typing import Any, Sequence

from rlinf_ext.protocol.images import ImageRef

# ServerArgs a vision-language rollout engine needs: the slow image processor (the actor's and the CPU
# engine's: pixel values agree) and per-request logit processors (banned ids)
VL_SERVER_ARGS = {"disable_fast_image_processor": True, "enable_custom_logit_processor": True}


def vl_server_overrides(model_type: str) -> dict[str, Any]:
    """Extra ``Engine(**kwargs)`` for ``rollout.model.model_type`` (none for text models)."""
    return dict(VL_SERVER_ARGS) if model_type == "qwen2.5_vl" else {}


def vision_runs(
    ids: Sequence[int], vision_start_id: int, image_pad_id: int, vision_end_id: int
) -> list[tuple[int, int]]:
    """``(start, end)`` index pairs of each ``<|vision_start|><|image_pad|>+<|vision_end|>`` run (end exclusive)."""
    runs, i = [], 0
    while i < len(ids):
        if ids[i] == vision_start_id:
            j = i + 1
            while j < len(ids) and ids[j] == image_pad_id:
                j += 1
            if j == i + 1 or j >= len(ids) or ids[j] != vision_end_id:
                raise ValueError(
                    f"malformed image run at position {i}: <|vision_start|> must be followed by "
                    "<|image_pad|> ids and <|vision_end|>"
                )
            runs.append((i, j + 1))
            i = j + 1
        else:
            i += 1
    return runs


def mm_request(
    prompt_ids: Sequence[int],
    images: Sequence[ImageRef],
    sampling_params: dict[str, Any],
    *,
    token_ids: tuple[int, int, int],
    banned_ids: Sequence[int] = (),
    logit_processor: str | None = None,
) -> dict[str, Any]:
    """The ``Engine.async_generate`` kwargs of one request: ids, every image so far (encoded bytes, in order), and
    the sampling params with the banned ids for the disallowed-tokens processor.

    ``token_ids``: (vision_start, image_pad, vision_end) ids. ``logit_processor``: the serialised
    ``DisallowedTokensLogitsProcessor`` (``disallowed_tokens_processor()``), required when ``banned_ids`` is set."""
    runs = vision_runs(prompt_ids, *token_ids)
    if len(runs) != len(images):
        raise ValueError(
            f"the context holds {len(runs)} image run(s) but {len(images)} image(s) were given; "
            "SGLang needs every image of the context, in order of appearance"
        )
    bad = [type(i).__name__ for i in images if not isinstance(i, ImageRef)]
    if bad:
        raise TypeError(f"images must be protocol.images.ImageRef objects, got {bad}")
    params = dict(sampling_params)
    request: dict[str, Any] = {"input_ids": [int(t) for t in prompt_ids], "sampling_params": params}
    if images:
        request["image_data"] = [img.data for img in images]  # SGLang's load_image takes raw bytes
    if banned_ids:
        if logit_processor is None:
            raise ValueError("banned ids need the serialised DisallowedTokensLogitsProcessor (logit_processor=)")
        params["custom_params"] = {"token_ids": sorted(int(t) for t in banned_ids)}
        request["custom_logit_processor"] = logit_processor
    return request


def retokenize_mismatch(sent_ids: Sequence[int], meta_info: dict[str, Any]) -> float:
    """1.0 when SGLang's re-tokenised prompt length differs from the ids the agent loop sent, else 0.0."""
    prompt_tokens = meta_info.get("prompt_tokens")
    if prompt_tokens is None:
        raise ValueError("SGLang's meta_info has no prompt_tokens; cannot check the re-tokenisation")
    return float(int(prompt_tokens) != len(sent_ids))


def disallowed_tokens_processor() -> str:  # pragma: no cover - needs the GPU extra (NOT GPU-verified)
    """SGLang's own ``DisallowedTokensLogitsProcessor``, serialised for ``custom_logit_processor``."""
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor  # lazy: GPU extra only

    return DisallowedTokensLogitsProcessor().to_str()
