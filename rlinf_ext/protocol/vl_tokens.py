"""Qwen2.5-VL token facts shared by the VL engine, the MM agent loop and the tiny assets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

VISION_START, VISION_END, VISION_PAD = "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_SPECIAL_TOKENS = (VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD)
IMAGE_PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END  # one image in text, before pad expansion


def token_id(tokenizer: Any, token: str) -> int:
    value = tokenizer.convert_tokens_to_ids(token)
    if value is None or value == getattr(tokenizer, "unk_token_id", None):
        raise ValueError(f"the tokenizer has no {token} token; a Qwen2.5-VL tokenizer is required")
    return int(value)


def vision_special_ids(tokenizer: Any) -> set[int]:
    return {token_id(tokenizer, t) for t in VISION_SPECIAL_TOKENS}


def banned_token_ids(tokenizer: Any, vocab_size: int) -> list[int]:
    """Ids a VL policy must never sample: the vision special tokens (a sampled `<|image_pad|>` breaks the next
    forward) and the padded vocabulary rows (they decode to nothing)."""
    return sorted(vision_special_ids(tokenizer) | set(range(len(tokenizer), vocab_size)))


def expand_image_pads(ids: Sequence[int], image_pad_id: int, pads_per_image: Sequence[int]) -> list[int]:
    """Replace the k-th `<|image_pad|>` by `pads_per_image[k]` copies (the image's grid / merge_size**2)."""
    out: list[int] = []
    k = 0
    for t in ids:
        if t == image_pad_id:
            if k >= len(pads_per_image):
                raise ValueError(f"the text has more image placeholders than the {len(pads_per_image)} images given")
            out += [image_pad_id] * int(pads_per_image[k])
            k += 1
        else:
            out.append(t)
    if k != len(pads_per_image):
        raise ValueError(f"the text has {k} image placeholders for {len(pads_per_image)} images")
    return out


def mm_token_type_ids(input_ids: Any, image_pad_id: int) -> Any:
    """transformers 5's modality ids of a ``[B, T]`` id tensor (0 text, 1 image). A Qwen2.5-VL forward or
    ``generate`` computes its 3-D mrope positions only when these are passed: without them it silently falls
    back to text-only positions (no error, different logits)."""
    return (input_ids == int(image_pad_id)).int()


def mrope_positions(model: Any, input_ids: Any, image_grid_thw: Any, attention_mask: Any = None) -> Any:
    """``[3, B, T]`` mrope positions from the model's own ``get_rope_index`` (images in row order). transformers 5
    moved it from ``Qwen2_5_VLForConditionalGeneration`` to its ``.model`` and made the modality ids its second
    argument; the image pad id comes from the model's config."""
    inner = getattr(model, "model", model)
    types = mm_token_type_ids(input_ids, model.config.image_token_id)
    positions, _ = inner.get_rope_index(input_ids, types, image_grid_thw=image_grid_thw, attention_mask=attention_mask)
    return positions


def text_vocab_size(config: Any) -> int:
    """Embedding rows of a Qwen2.5-VL config (a ``PretrainedConfig`` or a config.json dict): transformers 5 keeps
    ``vocab_size`` only in ``text_config`` (4.x also had it at the top level)."""
    if isinstance(config, dict):
        return int(config.get("vocab_size") or config["text_config"]["vocab_size"])
    return int(config.get_text_config().vocab_size)
