"""Facts about a Qwen2 / Qwen2.5 model that training and conversion share (no Megatron, no torch).

Dimensions read from a Hugging Face ``config.json`` (checked, errors name the field), whether a TP×PP split
fits them, Megatron's padded vocabulary, and the two spellings of the layer norms (Transformer Engine's fused
``layer_norm_weight`` names vs the local layer spec's ``input_layernorm`` / ``pre_mlp_layernorm``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("qwen2",)


@dataclass(frozen=True)
class QwenDims:
    """The dimensions of a Qwen2-family decoder that Megatron and the converter need."""

    model_type: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @property
    def q_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups


def load_hf_config_dict(hf_config: Any) -> dict:
    """A HF config as a plain dict, from a ``PretrainedConfig``, a dict, ``config.json`` or its folder."""
    if isinstance(hf_config, Mapping):
        return dict(hf_config)
    if isinstance(hf_config, (str, Path)):
        path = Path(hf_config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no HF config.json here (pass the model folder or its config.json)")
        return json.loads(path.read_text())
    if hasattr(hf_config, "to_dict"):
        return hf_config.to_dict()
    raise TypeError(f"cannot read a HF config from {type(hf_config).__name__}")


def rope_theta_of(cfg: Mapping) -> float:
    """RoPE base of a HF config dict: transformers 5 writes it under ``rope_parameters`` (and reads the top-level
    ``rope_theta`` of 4.x files into it); a 5.x config has no top-level key, so reading only that would silently
    give the 10000 default for a model built with 1e6."""
    params = cfg.get("rope_parameters") or {}
    for value in (params.get("rope_theta"), cfg.get("rope_theta")):
        if value is not None:
            return float(value)
    return 10000.0


def dims_from_hf_config(hf_config: Any) -> QwenDims:
    """Read and check the dimensions of a Qwen2/Qwen2.5 config (errors name the offending field)."""
    cfg = load_hf_config_dict(hf_config)
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)}); "
            "add its row to rlinf_ext/convert/mapping.py first"
        )
    heads = int(cfg["num_attention_heads"])
    groups = int(cfg.get("num_key_value_heads") or heads)
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    if heads % groups:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={groups}")
    return QwenDims(
        model_type=model_type,
        num_layers=int(cfg["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(cfg["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=groups,
        head_dim=head_dim,
        vocab_size=int(cfg["vocab_size"]),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=True,  # Qwen2 always has q/k/v biases and no other linear bias
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta_of(cfg),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
    )


def check_parallel_fits(dims: QwenDims, tp: int, pp: int) -> None:
    """Raise if the model cannot be split TP×PP (the reason names the dimension)."""
    problems = []
    if tp < 1 or pp < 1:
        problems.append(f"TP={tp}, PP={pp} must be >= 1")
    else:
        if dims.num_query_groups % tp:
            problems.append(f"num_key_value_heads={dims.num_query_groups} is not divisible by TP={tp}")
        if dims.num_attention_heads % tp:
            problems.append(f"num_attention_heads={dims.num_attention_heads} is not divisible by TP={tp}")
        if dims.ffn_hidden_size % tp:
            problems.append(f"intermediate_size={dims.ffn_hidden_size} is not divisible by TP={tp}")
        if dims.num_layers % pp:
            problems.append(f"num_hidden_layers={dims.num_layers} is not divisible by PP={pp}")
    if problems:
        raise ValueError("TP/PP inconsistent with the model: " + "; ".join(problems))


def default_padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 1) -> int:
    """Vocab rows in the Megatron embedding: a multiple of ``divisible_by * tp`` (RLinf uses 1)."""
    multiple = divisible_by * tp
    return ((vocab_size + multiple - 1) // multiple) * multiple


def adapt_layernorm_names(state: dict[str, Any], to_te: bool) -> dict[str, Any]:
    """Rename layer norms between TE fused names and local names (other keys untouched)."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        out[_renamed_norm(key, to_te)] = value
    return out


def _renamed_norm(key: str, to_te: bool) -> str:
    pairs = (
        (".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"),
        (".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"),
    )
    for local, te in pairs:
        src, dst = (local, te) if to_te else (te, local)
        if key.startswith("decoder.layers.") and key.endswith(src):
            return key[: -len(src)] + dst
    return key
