"""``--verify``: logits of the converted HF model vs the Megatron-core model built from the source.

The Megatron side merges the TP/PP shards in Megatron space (fused QKV stays fused, see
`mapping.merge_megatron_ranks`), loads them into a TP=1 ``GPTModel`` in this process, and both
models run in fp32 on the same fixed prompts, so a wrong HF mapping shows up as a logit gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rlinf_ext.convert.mg2hf import open_megatron_checkpoint, spec_for_checkpoint
from rlinf_ext.convert.state_dicts import merge_megatron_ranks
from rlinf_ext.models.cpu_shims import parallel_state_session
from rlinf_ext.models.megatron import (
    build_gpt_model,
    default_position_ids,
    forward_logits,
    load_megatron_state_dict,
)

FIXED_PROMPTS = (
    "The capital of France is",
    "Question: who wrote the play Hamlet?\nAnswer:",
    "<|im_start|>user\nSearch for the tallest mountain.<|im_end|>\n<|im_start|>assistant\n",
)
DEFAULT_TOLERANCE = 5e-3


@dataclass(frozen=True)
class VerifyResult:
    max_abs_diff: float
    tolerance: float
    num_prompts: int
    num_tokens: int

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance


def prompt_batch(hf_dir: Path, vocab_size: int, seq_len: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids + attention mask (left-padded) for the fixed prompts; random fixed ids without a tokenizer."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(hf_dir))
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        enc = tok(list(FIXED_PROMPTS), return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        if int(ids.max()) < vocab_size:
            return ids, mask
    except Exception:
        pass
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, vocab_size, (len(FIXED_PROMPTS), seq_len), generator=gen)
    return ids, torch.ones_like(ids)


def verify_conversion(mg_dir: str | Path, hf_dir: str | Path, *, tolerance: float = DEFAULT_TOLERANCE) -> VerifyResult:
    """Compare logits; needs memory for two fp32 copies of the model."""
    from transformers import AutoModelForCausalLM

    hf_dir = Path(hf_dir)
    layout, states = open_megatron_checkpoint(mg_dir)
    spec = spec_for_checkpoint(hf_dir, layout, states)
    merged = {k: v.float() for k, v in merge_megatron_ranks(states, spec).items()}
    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ids, mask = prompt_batch(hf_dir, spec.dims.vocab_size)
    positions = default_position_ids(mask, *ids.shape)
    with torch.no_grad():
        hf_logits = hf(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    del hf
    with parallel_state_session(1, 1):
        model = build_gpt_model(
            hf_dir, params_dtype=torch.float32, padded_vocab_size=spec.vocab_rows(layout.tp), init_weights=False
        )
        load_megatron_state_dict(model, merged, source=str(layout.iter_dir))
        del merged
        mg_logits = forward_logits(model, ids, attention_mask=mask, position_ids=positions)
    real = mask.bool()
    diff = (mg_logits - hf_logits)[real].abs().max().item()
    return VerifyResult(diff, tolerance, ids.shape[0], int(real.sum()))
