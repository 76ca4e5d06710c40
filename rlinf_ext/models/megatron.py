"""Megatron-core ``GPTModel`` for Qwen2 / Qwen2.5 built from a Hugging Face ``config.json``.

Shared by the Megatron actor (``training/megatron_policy.py``) and by ``rlinf-ext convert ... --verify``: one place
decides the Megatron configuration (RMSNorm, SwiGLU, RoPE base, GQA, qkv bias, tied embeddings, padded vocab),
how a state dict is loaded (strict, with clear errors), and how logits ``[B, S, V]`` come out. The model's
dimensions come from ``models/qwen2.py``.

Needs ``megatron.core.parallel_state`` initialised first (``models/cpu_shims.init_parallel_state``).

Layer specs (RLinf's ``actor.spec_name``): ``decoder_gpt`` = Transformer Engine's fused layers (flash/fused
attention: activation memory linear in the sequence length), ``local_gpt`` = Megatron's local layers (attention
scores ``[heads, T, T]`` materialised). On CPU the local spec is always used (TE is CUDA-only); on CUDA
``decoder_gpt`` without TE installed is refused rather than silently swapped (``layer_spec_uses_te``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer import TransformerConfig

from rlinf_ext.models.cpu_shims import apply_cpu_shims, cpu_mode
from rlinf_ext.models.qwen2 import (
    adapt_layernorm_names,
    check_parallel_fits,
    default_padded_vocab_size,
    dims_from_hf_config,
)


def te_available() -> bool:
    """Transformer Engine importable (and therefore its fused layer spec usable)."""
    try:  # lazy: optional GPU dependency, absent on CPU installs
        import transformer_engine  # noqa: F401
    except Exception:
        return False
    return True


SPEC_NAMES = ("decoder_gpt", "local_gpt")


def layer_spec_uses_te(spec_name: str) -> bool:
    """Whether ``actor.spec_name`` means the Transformer-Engine spec on this machine (raises if it cannot)."""
    if spec_name not in SPEC_NAMES:
        raise ValueError(f"actor.spec_name={spec_name!r}; use one of {SPEC_NAMES}.")
    if spec_name == "local_gpt" or cpu_mode():
        return False
    if not te_available():
        raise RuntimeError(
            "actor.spec_name=decoder_gpt needs Transformer Engine on CUDA, and it does not import. Install the GPU "
            "extra (pip install -e '.[gpu]'), or set actor.spec_name=local_gpt (Megatron's local layers: attention "
            "memory grows with the square of the sequence length; check `rlinf-ext plan`)."
        )
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
    """The ``TransformerConfig`` for a Qwen2 model; ``overrides`` set any other field (recompute, fusions...).

    The fused kernels default to off (CUDA-only, and they change numerics); ``use_cpu_initialization`` is
    forced on CPU."""
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
    fields["use_cpu_initialization"] = bool(fields["use_cpu_initialization"]) or on_cpu
    return TransformerConfig(**fields)


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
    # Every parameter in params_dtype, as Megatron-LM's Float16Module makes it: the local spec's torch norms are
    # created fp32, and a DistributedOptimizer group mixing fp32 and 16-bit parameters orders its main parameters
    # (fp32 first) unlike its index map, so save_parameter_state copied the wrong tensors and offload_to_cpu
    # moved views of DDP's buffer (both failed on an H100, scripts/gpu_smoke.py S3/S5). Buffers (rotary
    # frequencies) keep their dtype.
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != params_dtype:
            param.data = param.data.to(params_dtype)
    model.hf_vocab_size = dims.vocab_size
    model.uses_te_spec = bool(use_te)
    return model


class StateDictMismatch(ValueError):
    """A Megatron state dict does not fit the model (keys or shapes)."""


def load_megatron_state_dict(
    model: torch.nn.Module, state_dict: Mapping[str, Any], *, source: str = "state dict"
) -> None:
    """Strictly load one rank's Megatron state dict into ``model``.

    ``_extra_state`` entries are not weights (TE stores pickled metadata there, the local spec
    None): missing ones keep the model's own, ones the model lacks are dropped. TE fused layer-norm
    names and local names are translated to whatever this model uses. Every other key must match
    by name and shape, else `StateDictMismatch` lists all differences.
    """
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
    device = attention_mask.device if attention_mask is not None else None  # the padding mask's device (GPU runs)
    causal = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)
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
    if parallel_state.get_pipeline_model_parallel_world_size() != 1:
        raise ValueError(
            "forward_logits runs a whole model on one pipeline stage (PP=1); use Megatron's schedules for PP>1"
        )
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
        logits = model(input_ids.to(device), position_ids.to(device), mask, runtime_gather_output=True)
    finally:
        model.train(was_training)
    vocab = getattr(model, "hf_vocab_size", logits.shape[-1])
    return logits[..., :vocab]


@contextlib.contextmanager
def hidden_states_only(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block ``model(...)`` returns the decoder's output ``[S, B, H]`` (final norm applied) instead
    of logits: GPTModel skips its output layer when ``post_process`` is off (``gpt_model.py:_postprocess``),
    while the decoder keeps its own final norm. The caller projects to the vocabulary itself, in chunks
    (``training/logprobs.py``), so no full ``[S, B, V]`` tensor is ever made."""
    previous = model.post_process
    model.post_process = False
    try:
        yield
    finally:
        model.post_process = previous


def output_projection(model: torch.nn.Module):
    """``fn(hidden [s, B, H]) -> logits [s, B, V]`` (HF vocabulary, padding trimmed) through the model's own
    output layer (tied to the input embedding when the model ties them)."""
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    vocab = getattr(model, "hf_vocab_size", None)

    def project(hidden: torch.Tensor) -> torch.Tensor:
        logits, _ = model.output_layer(hidden, weight=weight, runtime_gather_output=True)
        return logits if vocab is None else logits[..., :vocab]

    return project
