"""The tiny vision-language stack: a Qwen2.5-VL-layout tokenizer and processor, and random tiny
`Qwen2_5_VLForConditionalGeneration` checkpoints (transformers 4.51.1, built offline).

Patch 14 and merge 2 are kept (SGLang hard-codes the resize factor 28): one language-model token per 28x28
pixels, so the tiny world's 56x56 emblems are 4 tokens each.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from rlinf_ext.assets.core.models import padded_vocab_size
from rlinf_ext.assets.core.tokenizer import ENDOFTEXT, IM_END, IM_START, train_tokenizer
from rlinf_ext.protocol.vl_tokens import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_PAD, VISION_START

VL_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD)
VL_TAG_TOKENS = (
    "<reason>",
    "</reason>",
    "<search>",
    "</search>",
    "<img>",
    "<text_search>",
    "</text_search>",
    "<answer>",
    "</answer>",
    "<information>",
    "</information>",
)
# the tiny world's images are 56x56; the processor's bounds keep them as they are
TINY_MIN_PIXELS = 56 * 56
TINY_MAX_PIXELS = 112 * 112


def qwen2_5_vl_chat_template() -> str:
    return (
        resources.files("rlinf_ext.assets.mmsearch")
        .joinpath("qwen2_5_vl_chat_template.jinja")
        .read_text(encoding="utf-8")
    )


@dataclass(frozen=True)
class TinyVLShape:
    """Text and vision knobs; the default is the random test model (H64), `hidden_size=128` the warm start's."""

    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_intermediate_size: int = 64
    vision_num_heads: int = 2

    @property
    def mrope_section(self) -> list[int]:
        """Split of head_dim/2 over (temporal, height, width), in Qwen2.5-VL's 2:3:3 proportion."""
        half = self.hidden_size // self.num_attention_heads // 2
        t = half // 4
        h = (half - t) // 2
        return [t, h, half - t - h]


def train_vl_tokenizer(texts: list[str], vocab_size: int = 2000):
    from transformers import Qwen2TokenizerFast

    return train_tokenizer(
        texts,
        vocab_size,
        tags=VL_TAG_TOKENS,
        specials=VL_SPECIAL_TOKENS,
        chat_template=qwen2_5_vl_chat_template(),
        tokenizer_class=Qwen2TokenizerFast,
        unk_token=None,
        bos_token=None,
    )


def make_processor(tokenizer, min_pixels: int = TINY_MIN_PIXELS, max_pixels: int = TINY_MAX_PIXELS):
    from transformers import Qwen2VLImageProcessorPil as Qwen2VLImageProcessor  # the PIL one: no torchvision

    from rlinf_ext.generation.vl_processor import ImageOnlyQwen2_5_VLProcessor as Qwen2_5_VLProcessor  # lazy: heavy

    image_processor = Qwen2VLImageProcessor(
        min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14, temporal_patch_size=2, merge_size=2
    )
    return Qwen2_5_VLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=qwen2_5_vl_chat_template()
    )


def qwen2_5_vl_config(tokenizer, shape: TinyVLShape):
    from transformers import Qwen2_5_VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VL_SPECIAL_TOKENS}
    return Qwen2_5_VLConfig(
        vocab_size=padded_vocab_size(len(tokenizer)),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=shape.num_hidden_layers,
        rope_scaling={"type": "mrope", "mrope_section": shape.mrope_section},
        vision_config=dict(
            depth=shape.vision_depth,
            hidden_size=shape.vision_hidden_size,
            intermediate_size=shape.vision_intermediate_size,
            num_heads=shape.vision_num_heads,
            in_channels=3,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            tokens_per_second=2,
            window_size=56,
            out_hidden_size=shape.hidden_size,
            fullatt_block_indexes=[shape.vision_depth - 1],
        ),
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        vision_token_id=ids[VISION_PAD],
        bos_token_id=None,
        eos_token_id=ids[ENDOFTEXT],
        pad_token_id=ids[ENDOFTEXT],
        torch_dtype="float32",
    )


def make_qwen2_5_vl(tokenizer, shape: TinyVLShape, seed: int):
    from transformers import GenerationConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(qwen2_5_vl_config(tokenizer, shape)).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    return model


def save_vl_model(model, processor, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    processor.save_pretrained(str(out_dir))
