"""Generating from an image with a saved Qwen2.5-VL directory (what a user does with the exported model)."""

from __future__ import annotations

import torch

from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.generation.hf_vl import load_vl_processor


def generate_from_image(model, model_dir, mm, max_new_tokens: int = 16) -> str:
    """Greedy text for the first test question's image, with the processor saved beside the weights."""
    processor = load_vl_processor(model_dir)
    row = read_fvqa(mm.fvqa_test, 56 * 56, 56 * 56, limit=1)[0]
    content = [{"type": "image"} for _ in row.images] + [{"type": "text", "text": row.question}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    inputs = processor(text=[text], images=[r.to_pil() for r in row.images], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return processor.tokenizer.decode(out[0, inputs.input_ids.shape[1] :])
