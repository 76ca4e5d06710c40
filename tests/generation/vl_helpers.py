"""Shared helpers of the vision-language tests: prompts with images and a forcing logits processor."""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.generation.sglang_vl import vision_runs
from tests.support.signature_checks import checked_against

PX = 56 * 56


def mm_test_rows(mm, n: int | None = None):
    return read_fvqa(mm.fvqa_test, PX, PX, limit=n)


def text_positions_after_images(ids, token_ids: tuple[int, int, int]) -> list[int]:
    """Positions of the multimodal probe compared after a weight sync: text tokens after the last image (the
    image's own positions go through the vision tower, whose pixel path may differ slightly by engine)."""
    runs = vision_runs(ids, *token_ids)
    start = runs[-1][1] if runs else 0
    return list(range(start, len(ids)))


def chat_prompt_ids(processor, question: str, images) -> list[int]:
    """The chat template with the images first, pads expanded by the processor itself."""
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": question}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return (
        processor(text=[text], images=[r.to_pil() for r in images] or None, return_tensors="pt").input_ids[0].tolist()
    )


class ForceTokens(LogitsProcessor):
    """A logits processor (transformers' own base, its ``__call__`` spelled and checked as the base's) that forces
    `ids` one by one (then leaves the model free): scripted continuations."""

    def __init__(self, ids: list[int], prompt_len: int):
        self.ids, self.prompt_len = ids, prompt_len

    @checked_against(LogitsProcessor.__call__)
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self.prompt_len
        if 0 <= step < len(self.ids):
            forced = torch.full_like(scores, float("-inf"))
            forced[:, self.ids[step]] = 0.0
            return forced
        return scores
