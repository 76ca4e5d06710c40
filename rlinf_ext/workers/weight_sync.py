"""Actor -> rollout weight sync payload and the logits check run after every sync.

The actor sends its weights under HF names (through the conversion mapping) together with its own logits on
a fixed probe sequence; the rollout engine loads the weights, runs the same probe through its own
(transformers) model and refuses to continue if the logits differ: a wrong mapping or a partial load then
fails loudly at the first step instead of silently training one model and sampling another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_ext.models.dtypes import dtype_of_hf_name, dtype_of_precision

PROBE_LENGTH = 16
DEFAULT_ATOL = 1e-3  # fp32 on both sides differs by summation order only (~1e-6); bf16 engines need more


class WeightSyncError(RuntimeError):
    """The rollout engine's weights do not reproduce the actor's logits after a sync."""


@dataclass
class SyncPayload:
    hf_state: dict[str, torch.Tensor]
    probe_ids: torch.Tensor | None = None  # [1, L]
    probe_logits: torch.Tensor | None = None  # [1, L, V] actor logits, fp32
    version: int = 0  # actor optimizer steps so far


def rollout_dtype(cfg) -> torch.dtype:
    """The dtype the rollout engine holds its weights in, so the actor sends them already cast (half the bytes
    of fp32 master weights for a bf16/fp16 engine): ``rollout.hf.dtype`` for the CPU transformers engine,
    ``rollout.model.precision`` for SGLang/vLLM."""
    rollout = cfg.rollout
    if str(rollout.rollout_backend) == "hf":
        return dtype_of_hf_name(str(rollout.hf.dtype), "rollout.hf.dtype")
    return dtype_of_precision(str(rollout.model.precision), "rollout.model.precision")


def probe_ids(vocab_size: int, length: int = PROBE_LENGTH, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (1, length), generator=g)


def check_logits_match(expected: torch.Tensor, actual: torch.Tensor, atol: float = DEFAULT_ATOL) -> float:
    """Max absolute logit difference; raises ``WeightSyncError`` above ``atol``."""
    if expected.shape != actual.shape:
        raise WeightSyncError(f"probe logits shape {tuple(actual.shape)} != actor's {tuple(expected.shape)} (vocab mismatch?)")
    diff = float((expected.float() - actual.float()).abs().max())
    if not diff <= atol:
        raise WeightSyncError(
            f"rollout logits differ from the actor's by {diff:.3g} (> {atol:g}) after weight sync: the "
            "Megatron->HF mapping or the load is wrong. Check rlinf_ext/convert/mapping.py for this model."
        )
    return diff


def load_into_hf_model(model: torch.nn.Module, hf_state: dict[str, torch.Tensor]) -> None:
    """Copy weights into a transformers model in place; a tied ``lm_head`` may be absent."""
    own = model.state_dict()
    missing = [k for k in own if k not in hf_state and not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    unexpected = [k for k in hf_state if k not in own]
    if missing or unexpected:
        raise WeightSyncError(f"weight sync keys do not fit the rollout model: missing {missing[:8]}, unexpected {unexpected[:8]}")
    with torch.no_grad():
        for k, v in hf_state.items():
            own[k].copy_(v.to(own[k].dtype))
