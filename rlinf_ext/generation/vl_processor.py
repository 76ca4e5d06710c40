"""The Qwen2.5-VL processor without a video processor (transformers 5 on a CPU torch).

transformers 5's ``Qwen2_5_VLProcessor`` requires a ``video_processor``, and every video processor needs
torchvision, which cannot be installed beside the CPU build of torch (PyPI only has CUDA builds; see
scripts/install.sh). rlinf_ext sends only images, so this subclass drops the video processor and keeps everything
else: the same token expansion (``<|image_pad|>`` repeated per image grid), ``mm_token_type_ids``, chat template,
and the slow (PIL) image processor. It saves under the stock name ``Qwen2_5_VLProcessor``, so a directory it
writes loads with ``AutoProcessor`` wherever torchvision is installed (a GPU node, vLLM). It is also registered
for ``AutoProcessor`` as custom code (transformers' ``register_for_auto_class``: the directory gets this module and
an ``auto_map``), so where torchvision is missing ``AutoProcessor.from_pretrained(DIR, trust_remote_code=True)``
loads this class: how vLLM on a CPU torch loads the processor (``generation/vllm_vl.py``).
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, Qwen2_5_VLProcessor
from transformers.processing_utils import ProcessorMixin

STOCK_NAME = "Qwen2_5_VLProcessor"


class ImageOnlyQwen2_5_VLProcessor(Qwen2_5_VLProcessor):
    """``Qwen2_5_VLProcessor`` whose sub-processors are the image processor and the tokenizer (no video)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # Qwen2_5_VLProcessor.__init__ without the video processor (ProcessorMixin reads the sub-processors from
        # this signature: image_processor and tokenizer)
        self.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
        self.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
        self.image_token_id = getattr(tokenizer, "image_token_id", None) or tokenizer.convert_tokens_to_ids(
            self.image_token
        )
        self.video_token_id = getattr(tokenizer, "video_token_id", None) or tokenizer.convert_tokens_to_ids(
            self.video_token
        )
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    def to_dict(self):
        out = super().to_dict()
        out["processor_class"] = STOCK_NAME
        return out

    def save_pretrained(self, save_directory, *args, **kwargs):
        saved = super().save_pretrained(save_directory, *args, **kwargs)
        self.tokenizer._set_processor_class(STOCK_NAME)  # ProcessorMixin recorded this class's own name
        self.tokenizer.save_pretrained(save_directory)
        return saved


ImageOnlyQwen2_5_VLProcessor.register_for_auto_class("AutoProcessor")


def load_image_only_processor(path: str | Path) -> ImageOnlyQwen2_5_VLProcessor:
    """The fast tokenizer and the slow (PIL) image processor of a saved Qwen2.5-VL processor directory, with
    the processor's saved chat template."""
    return ImageOnlyQwen2_5_VLProcessor.from_pretrained(
        str(path), use_fast=False, tokenizer=AutoTokenizer.from_pretrained(str(path))
    )
