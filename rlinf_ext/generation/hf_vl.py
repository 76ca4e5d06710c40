"""A CPU vision-language `Generator`: transformers' `Qwen2_5_VLForConditionalGeneration` with images.

`await gen.generate(prompt_ids, sampling_params, images=[ImageRef, ...])`: `images` are every image of the
context in order of appearance, and `prompt_ids` already hold each image's expanded `<|image_pad|>` run. The
batching, stop strings, turn ends (`generation/turn_end.py`) and weight updates are `HFGenerator`'s: concurrent
calls with equal sampling settings are left-padded into one `generate`, the rows' `pixel_values` concatenated in
row order. Banned ids (vision special tokens, padded vocabulary rows) are suppressed at sampling and get log-prob
-inf, so the returned log-probs are those of the distribution sampled from. Preprocessed images are cached by
sha1.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from rlinf_ext.generation.hf import HFGenerator, _Request
from rlinf_ext.protocol.generation import GenerationResult
from rlinf_ext.protocol.images import ImageRef
from rlinf_ext.protocol.vl_tokens import IMAGE_PAD, banned_token_ids, mm_token_type_ids, text_vocab_size, token_id


def load_vl_processor(path: str | Path):
    """The fast tokenizer with the slow image processor (the one the actor and SGLang's
    `disable_fast_image_processor` use; the fast one needs torchvision and differs slightly)."""
    from rlinf_ext.generation.vl_processor import load_image_only_processor  # lazy: imports transformers

    # transformers 5's Qwen2_5_VLProcessor needs a video processor, hence torchvision: images only here
    return load_image_only_processor(path)


class ImageInputs:
    """sha1 -> (pixel_values, grid_thw) of one image, least recently used evicted past `capacity`."""

    def __init__(self, image_processor: Any, capacity: int = 512):
        self.image_processor = image_processor
        self.capacity = capacity
        self._cache: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, ref: ImageRef) -> tuple[torch.Tensor, torch.Tensor]:
        found = self._cache.get(ref.sha1)
        if found is not None:
            self.hits += 1
            self._cache.move_to_end(ref.sha1)
            return found
        self.misses += 1
        out = self.image_processor(images=[ref.to_pil()], return_tensors="pt")
        found = (out.pixel_values, out.image_grid_thw)
        self._cache[ref.sha1] = found
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return found

    def tokens(self, ref: ImageRef) -> int:
        """`<|image_pad|>` tokens of this image: grid.prod() // merge_size**2."""
        grid = self.get(ref)[1][0]
        return int(grid.prod()) // int(self.image_processor.merge_size) ** 2

    def batch(self, refs: list[ImageRef]) -> dict[str, torch.Tensor]:
        pairs = [self.get(r) for r in refs]
        return {"pixel_values": torch.cat([p for p, _ in pairs]), "image_grid_thw": torch.cat([g for _, g in pairs])}


class HFVLGenerator(HFGenerator):
    def __init__(
        self,
        model: Any,
        processor: Any,
        *,
        max_batch_size: int = 16,
        return_logprobs: bool = False,
        seed: int | None = None,
        banned_ids: list[int] | None = None,
        image_cache_size: int = 512,
        logits_processors: list[Any] | None = None,
    ):
        """`banned_ids=None`: the vision special ids and the padded vocabulary rows (`vl_tokens.banned_token_ids`)."""
        super().__init__(
            model,
            processor.tokenizer,
            max_batch_size=max_batch_size,
            return_logprobs=return_logprobs,
            seed=seed,
            logits_processors=logits_processors,
        )
        self.processor = processor
        self.image_pad_id = token_id(processor.tokenizer, IMAGE_PAD)
        self.banned_ids = (
            banned_token_ids(processor.tokenizer, text_vocab_size(model.config))
            if banned_ids is None
            else sorted(banned_ids)
        )
        self.images = ImageInputs(processor.image_processor, image_cache_size)

    @classmethod
    def from_pretrained(
        cls, model_path: str | Path, dtype: str = "float32", num_threads: int | None = 1, **kwargs: Any
    ) -> "HFVLGenerator":
        """`num_threads`: torch intra-op threads of this process (1: several CPU workers share the cores;
        two threads per process on a busy 2-core box ran ~30x slower). None leaves torch's setting."""
        from transformers import Qwen2_5_VLForConditionalGeneration

        if num_threads is not None:
            torch.set_num_threads(int(num_threads))
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(model_path), dtype=getattr(torch, dtype))
        return cls(model, load_vl_processor(model_path), **kwargs)

    @classmethod
    def from_config(cls, cfg: Any) -> "HFVLGenerator":
        hf = cfg.rollout.hf
        return cls.from_pretrained(
            str(cfg.rollout.model.model_path),
            dtype=hf.dtype,
            num_threads=1,
            max_batch_size=int(hf.max_batch_size),
            seed=int(cfg.runner.seed),
        )

    def _check_images(self, images: list[Any] | None) -> None:
        bad = [type(i).__name__ for i in images or [] if not isinstance(i, ImageRef)]
        if bad:
            raise TypeError(f"images must be protocol.images.ImageRef objects, got {bad}")

    def _model_inputs(self, input_ids: torch.Tensor, extra_inputs: dict[str, Any] | None) -> dict[str, Any]:
        inputs = super()._model_inputs(input_ids, extra_inputs)
        if "image_grid_thw" in inputs:  # transformers 5: without them `generate` uses text-only positions
            inputs["mm_token_type_ids"] = mm_token_type_ids(input_ids, self.image_pad_id)
        return inputs

    def _run_batch(self, batch: list[_Request]) -> list[GenerationResult]:
        refs: list[ImageRef] = []
        for request in batch:
            expected = sum(self.images.tokens(r) for r in request.images or [])
            found = request.prompt_ids.count(self.image_pad_id)
            if found != expected:
                raise ValueError(
                    f"the context holds {found} <|image_pad|> ids but its {len(request.images or [])} "
                    f"image(s) need {expected}; expand each image's pad to its grid before generating"
                )
            refs += request.images or []
        extra = self.images.batch(refs) if refs else None
        return self._generate_batch(
            [r.prompt_ids for r in batch], [r.params for r in batch], extra_inputs=extra, banned_ids=self.banned_ids
        )
