"""Declarative Megatron-core ↔ Hugging Face mapping for Qwen2 / Qwen2.5 (table ready for Qwen3, Llama).

A model family is a list of `Rule` rows: which Megatron tensor corresponds to which HF tensor(s) and
how it is split over tensor-parallel ranks (`Kind`). Everything else — whole-model conversion,
streaming per layer, strict checks — is driven by the table, so adding Qwen3 (q/k layernorms, no qkv
bias) or Llama (no bias) is adding rows with a ``when`` condition.

Conventions (docs/searchr1-facts.md §9):
* fused QKV is grouped per KV group: ``[q heads of the group | k | v] × head_dim`` rows per group;
* ``linear_fc1`` is ``[gate; up]`` and each TP rank holds ``[gate_shard; up_shard]``;
* column-parallel tensors split on dim 0, row-parallel (``linear_proj``, ``linear_fc2``) on dim 1,
  norms replicated, embeddings/output layer split on the (padded) vocab dim;
* layer norms are named the Transformer-Engine way (``linear_qkv.layer_norm_weight``) or the local
  way (``input_layernorm.weight``); both are accepted and either can be produced;
* layers split evenly over PP ranks; the embedding lives on the first stage, the final norm and
  output layer on the last (with tied embeddings and PP>1 the last stage keeps a copy of the
  embedding as ``output_layer.weight``, as Megatron-core's GPTModel does).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from rlinf_ext.models.qwen2 import QwenDims, check_parallel_fits, dims_from_hf_config

EXTRA_STATE_SUFFIX = "._extra_state"


class ConversionError(ValueError):
    """A checkpoint cannot be converted; the message names the path/key and the reason."""


class Kind(enum.Enum):
    REPLICATED = "replicated"  # same on every TP rank (norms)
    COLUMN = "column"  # split on dim 0
    ROW = "row"  # split on dim 1
    VOCAB = "vocab"  # split on dim 0 after padding the vocab rows
    QKV = "qkv"  # fused per KV group, then split on dim 0 (weight or bias)
    GLU = "glu"  # [gate; up], each rank [gate_shard; up_shard]


@dataclass(frozen=True)
class Rule:
    """One Megatron tensor ↔ one or more HF tensors.

    ``mg``/``mg_te``: Megatron name (local spec / TE spec; the same when ``mg_te`` is None), with
    ``{i}`` for the layer index. ``hf``: HF names with ``{i}``. ``when``: feature flag that must be
    true in the `ConvertSpec` for the row to exist (e.g. ``"qkv_bias"``, ``"untied"``).
    """

    mg: str
    hf: tuple[str, ...]
    kind: Kind
    mg_te: str | None = None
    when: str | None = None


# unit: "pre" (first PP stage), "layer" (each decoder layer), "post" (last PP stage)
QWEN2_TABLE: dict[str, tuple[Rule, ...]] = {
    "pre": (Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), Kind.VOCAB),),
    "layer": (
        Rule(
            "decoder.layers.{i}.input_layernorm.weight",
            ("model.layers.{i}.input_layernorm.weight",),
            Kind.REPLICATED,
            mg_te="decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight",
        ),
        Rule(
            "decoder.layers.{i}.self_attention.linear_qkv.weight",
            (
                "model.layers.{i}.self_attn.q_proj.weight",
                "model.layers.{i}.self_attn.k_proj.weight",
                "model.layers.{i}.self_attn.v_proj.weight",
            ),
            Kind.QKV,
        ),
        Rule(
            "decoder.layers.{i}.self_attention.linear_qkv.bias",
            (
                "model.layers.{i}.self_attn.q_proj.bias",
                "model.layers.{i}.self_attn.k_proj.bias",
                "model.layers.{i}.self_attn.v_proj.bias",
            ),
            Kind.QKV,
            when="qkv_bias",
        ),
        Rule(
            "decoder.layers.{i}.self_attention.linear_proj.weight",
            ("model.layers.{i}.self_attn.o_proj.weight",),
            Kind.ROW,
        ),
        Rule(
            "decoder.layers.{i}.pre_mlp_layernorm.weight",
            ("model.layers.{i}.post_attention_layernorm.weight",),
            Kind.REPLICATED,
            mg_te="decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight",
        ),
        Rule(
            "decoder.layers.{i}.mlp.linear_fc1.weight",
            ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"),
            Kind.GLU,
        ),
        Rule(
            "decoder.layers.{i}.mlp.linear_fc2.weight",
            ("model.layers.{i}.mlp.down_proj.weight",),
            Kind.ROW,
        ),
    ),
    "post": (
        Rule("decoder.final_layernorm.weight", ("model.norm.weight",), Kind.REPLICATED),
        Rule("output_layer.weight", ("lm_head.weight",), Kind.VOCAB, when="untied"),
    ),
}

MODEL_TABLES: dict[str, dict[str, tuple[Rule, ...]]] = {"qwen2": QWEN2_TABLE}

# Linear modules whose `_extra_state` Megatron checkpoints carry (TE metadata; None on the local spec).
LINEAR_MODULES = (
    "self_attention.linear_qkv",
    "self_attention.linear_proj",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
)

# Preset dimensions (HF config.json values) for the scripts; --hf-template/--hf configs win.
PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        num_hidden_layers=24,
        hidden_size=896,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        num_hidden_layers=28,
        hidden_size=1536,
        intermediate_size=8960,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-3b": dict(
        num_hidden_layers=36,
        hidden_size=2048,
        intermediate_size=11008,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        num_hidden_layers=28,
        hidden_size=3584,
        intermediate_size=18944,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}
_PRESET_COMMON = dict(
    model_type="qwen2",
    architectures=["Qwen2ForCausalLM"],
    hidden_act="silu",
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=32768,
    torch_dtype="bfloat16",
    bos_token_id=151643,
    eos_token_id=151643,
    use_sliding_window=False,
)


def preset_hf_config(name: str) -> dict[str, Any]:
    """The HF config dict of a preset (``qwen2.5-3b`` ...)."""
    key = name.lower()
    if key not in PRESETS:
        raise ConversionError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return {**_PRESET_COMMON, **PRESETS[key]}


@dataclass(frozen=True)
class ConvertSpec:
    """Everything the mapping needs: model dims, vocab padding and which layer-norm names to write."""

    dims: QwenDims
    padded_vocab_size: int | None = None  # None: vocab rounded up to a multiple of TP
    te_layernorm_names: bool = True  # write TE fused names (RLinf/Megatron on GPU); False: local names
    extra_state: str = "tensor_pickle_none"  # "tensor_pickle_none" (TE style), "none", "omit"
    table: Mapping[str, tuple[Rule, ...]] = field(default_factory=lambda: QWEN2_TABLE, compare=False, repr=False)

    @classmethod
    def from_hf_config(cls, hf_config: Any, **kwargs: Any) -> "ConvertSpec":
        dims = dims_from_hf_config(hf_config)
        return cls(dims=dims, table=MODEL_TABLES[dims.model_type], **kwargs)

    def flags(self) -> dict[str, bool]:
        return {
            "qkv_bias": self.dims.qkv_bias,
            "untied": not self.dims.tie_word_embeddings,
            "tied": self.dims.tie_word_embeddings,
        }

    def vocab_rows(self, tp: int) -> int:
        if self.padded_vocab_size is not None:
            if self.padded_vocab_size < self.dims.vocab_size or self.padded_vocab_size % tp:
                raise ConversionError(
                    f"padded vocab {self.padded_vocab_size} must be >= vocab_size {self.dims.vocab_size} "
                    f"and divisible by TP={tp}"
                )
            return self.padded_vocab_size
        return -(-self.dims.vocab_size // tp) * tp

    def rules(self, unit: str) -> list[Rule]:
        flags = self.flags()
        return [r for r in self.table[unit] if r.when is None or flags[r.when]]


# --------------------------------------------------------------------------- layer / stage geometry


def layers_per_stage(spec: ConvertSpec, pp: int) -> int:
    return spec.dims.num_layers // pp


def stage_of_layer(spec: ConvertSpec, layer: int, pp: int) -> tuple[int, int]:
    """(pp_rank, local layer index) of a global layer."""
    per = layers_per_stage(spec, pp)
    return layer // per, layer % per


def units(spec: ConvertSpec) -> list[tuple[str, int | None]]:
    """The conversion units in model order: ("pre", None), ("layer", 0..L-1), ("post", None)."""
    return [("pre", None), *[("layer", i) for i in range(spec.dims.num_layers)], ("post", None)]


def unit_stage(spec: ConvertSpec, unit: str, layer: int | None, pp: int) -> tuple[int, int | None]:
    if unit == "pre":
        return 0, None
    if unit == "post":
        return pp - 1, None
    return stage_of_layer(spec, layer, pp)


def mg_name(rule: Rule, local_layer: int | None, te: bool) -> str:
    name = rule.mg_te if (te and rule.mg_te) else rule.mg
    return name.format(i=local_layer)


def hf_names(rule: Rule, layer: int | None) -> list[str]:
    return [n.format(i=layer) for n in rule.hf]


# --------------------------------------------------------------------------- spec utilities


def check_parallel(spec: ConvertSpec, tp: int, pp: int) -> None:
    try:
        check_parallel_fits(spec.dims, tp, pp)
    except ValueError as e:
        raise ConversionError(str(e)) from None
    spec.vocab_rows(tp)


def grid_of(keys: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """(TP, PP) of a set of rank keys; raises if the grid has holes."""
    keys = set(keys)
    if not keys:
        raise ConversionError("no Megatron ranks given")
    tp = max(k[0] for k in keys) + 1
    pp = max(k[1] for k in keys) + 1
    missing = [(t, p) for p in range(pp) for t in range(tp) if (t, p) not in keys]
    if missing:
        raise ConversionError(f"missing Megatron ranks (tp, pp): {missing} for a {tp}x{pp} grid")
    return tp, pp
