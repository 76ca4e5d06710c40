"""Megatron-core ``GPTModel`` for Qwen2 / Qwen2.5 built from a Hugging Face ``config.json``.

Shared by the Megatron actor and by ``rlinf-ext convert ... --verify``: one place decides the
Megatron configuration (RMSNorm, SwiGLU, RoPE base, GQA, qkv bias, tied embeddings, padded vocab),
how a state dict is loaded (strict, with clear errors), and how logits ``[B, S, V]`` come out.

Needs ``megatron.core.parallel_state`` initialised first (``cpu_shims.init_parallel_state``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from rlinf_ext.engines.megatron.cpu_shims import apply_cpu_shims, cpu_mode

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
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
    )


def te_available() -> bool:
    """Transformer Engine importable (and therefore its fused layer spec usable)."""
    try:
        import transformer_engine  # noqa: F401
    except Exception:
        return False
    return True


def transformer_config_from_hf(
    hf_config: Any,
    *,
    params_dtype: torch.dtype = torch.float32,
    tp: int | None = None,
    pp: int | None = None,
    init_weights: bool = True,
    **overrides: Any,
):
    """The ``TransformerConfig`` for a Qwen2 model; ``overrides`` set any other field (recompute, SP...)."""
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.transformer import TransformerConfig

    dims = dims_from_hf_config(hf_config)
    if tp is None:
        tp = parallel_state.get_tensor_model_parallel_world_size()
    if pp is None:
        pp = parallel_state.get_pipeline_model_parallel_world_size()
    check_parallel_fits(dims, tp, pp)
    on_cpu = cpu_mode()
    fields: dict[str, Any] = dict(
        num_layers=dims.num_layers,
        hidden_size=dims.hidden_size,
        ffn_hidden_size=dims.ffn_hidden_size,
        num_attention_heads=dims.num_attention_heads,
        num_query_groups=dims.num_query_groups,
        kv_channels=dims.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=dims.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=dims.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=on_cpu,
        perform_initialization=init_weights,
        # Fused kernels are CUDA-only (and change numerics); the actor may turn them on via overrides.
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


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


def build_gpt_model(
    hf_config: Any,
    *,
    params_dtype: torch.dtype = torch.float32,
    padded_vocab_size: int | None = None,
    use_te: bool | None = None,
    pre_process: bool | None = None,
    post_process: bool | None = None,
    init_weights: bool = True,
    parallel_output: bool = True,
    **config_overrides: Any,
):
    """A Megatron-core ``GPTModel`` for this rank (TP/PP from ``parallel_state``).

    ``use_te=None`` picks the Transformer-Engine layer spec when TE imports, else the local spec.
    ``padded_vocab_size=None`` keeps the HF vocab (RLinf's choice) rounded up to a multiple of TP.
    The HF vocab size is kept on the model as ``hf_vocab_size`` so `forward_logits` trims padding.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    apply_cpu_shims()
    dims = dims_from_hf_config(hf_config)
    config = transformer_config_from_hf(
        hf_config, params_dtype=params_dtype, init_weights=init_weights, **config_overrides
    )
    tp = config.tensor_model_parallel_size
    if padded_vocab_size is None:
        padded_vocab_size = default_padded_vocab_size(dims.vocab_size, tp)
    if padded_vocab_size < dims.vocab_size or padded_vocab_size % tp:
        raise ValueError(
            f"padded_vocab_size={padded_vocab_size} must be >= vocab_size={dims.vocab_size} and divisible by TP={tp}"
        )
    if use_te is None:
        use_te = te_available() and not cpu_mode()
    if use_te:
        spec = get_gpt_layer_with_transformer_engine_spec()
    else:
        spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    if pre_process is None:
        pre_process = parallel_state.is_pipeline_first_stage()
    if post_process is None:
        post_process = parallel_state.is_pipeline_last_stage()
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=padded_vocab_size,
        max_sequence_length=dims.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=parallel_output,
        share_embeddings_and_output_weights=dims.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=int(dims.rope_theta) if float(dims.rope_theta).is_integer() else dims.rope_theta,
    )
    model.hf_vocab_size = dims.vocab_size
    model.uses_te_spec = bool(use_te)
    return model


class StateDictMismatch(ValueError):
    """A Megatron state dict does not fit the model (keys or shapes)."""


def load_megatron_state_dict(model: torch.nn.Module, state_dict: Mapping[str, Any], *, source: str = "state dict") -> None:
    """Strictly load one rank's Megatron state dict into ``model``.

    ``_extra_state`` entries are not weights (TE stores pickled metadata there, the local spec
    None): missing ones keep the model's own, ones the model lacks are dropped. TE fused layer-norm
    names and local names are translated to whatever this model uses. Every other key must match
    by name and shape, else `StateDictMismatch` lists all differences.
    """
    from rlinf_ext.convert.mapping import adapt_layernorm_names

    own = model.state_dict()
    uses_te = any(k.endswith("layer_norm_weight") for k in own)
    sd = adapt_layernorm_names(dict(state_dict), to_te=uses_te)
    sd = {k: v for k, v in sd.items() if not k.endswith("._extra_state") or k in own}
    for k, v in own.items():
        if k.endswith("._extra_state") and k not in sd:
            sd[k] = v
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in sd and torch.is_tensor(own[k]) and torch.is_tensor(sd[k]) and sd[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys: {missing}")
        if unexpected:
            parts.append(f"unexpected keys: {unexpected}")
        if shapes:
            parts.append(f"shape mismatches: {shapes}")
        raise StateDictMismatch(
            f"{source} does not fit the model ({'; '.join(parts)}); check TP/PP and the HF config used to build it"
        )
    model.load_state_dict(sd, strict=True)


def causal_padding_mask(attention_mask: torch.Tensor | None, seq_len: int, batch: int) -> torch.Tensor:
    """Megatron's boolean mask ``[B, 1, S, S]``, True = do not attend: causal, plus padded keys."""
    causal = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)
    mask = causal.expand(batch, 1, seq_len, seq_len)
    if attention_mask is not None:
        pad_keys = ~attention_mask.to(torch.bool)[:, None, None, :]
        mask = mask | pad_keys
    return mask.contiguous()


def default_position_ids(attention_mask: torch.Tensor | None, batch: int, seq_len: int) -> torch.Tensor:
    """0, 1, 2... over real tokens (left padding gets position 0), like HF generation does."""
    if attention_mask is None:
        return torch.arange(seq_len, dtype=torch.long).expand(batch, seq_len).contiguous()
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp_(min=0)


@torch.no_grad()
def forward_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Full-vocabulary logits ``[B, S, V]`` (gathered over TP, vocab padding trimmed) for PP=1.

    ``attention_mask`` is the HF-style ``[B, S]`` 1/0 mask; it becomes Megatron's causal+padding
    mask and, unless ``position_ids`` are given, the positions.
    """
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() != 1:
        raise ValueError("forward_logits runs a whole model on one pipeline stage (PP=1); use Megatron's schedules for PP>1")
    batch, seq_len = input_ids.shape
    device = next(model.parameters()).device
    if position_ids is None:
        position_ids = default_position_ids(attention_mask, batch, seq_len)
    mask = None
    if attention_mask is not None and not bool(attention_mask.all()):
        mask = causal_padding_mask(attention_mask, seq_len, batch).to(device)
    elif not getattr(model, "uses_te_spec", False):
        mask = causal_padding_mask(None, seq_len, batch).to(device)
    was_training = model.training
    model.eval()
    try:
        logits = model(
            input_ids.to(device), position_ids.to(device), mask, runtime_gather_output=True
        )
    finally:
        model.train(was_training)
    vocab = getattr(model, "hf_vocab_size", logits.shape[-1])
    return logits[..., :vocab]
