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
import pickle
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

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
        num_hidden_layers=24, hidden_size=896, intermediate_size=4864, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        num_hidden_layers=28, hidden_size=1536, intermediate_size=8960, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "qwen2.5-3b": dict(
        num_hidden_layers=36, hidden_size=2048, intermediate_size=11008, num_attention_heads=16,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        num_hidden_layers=28, hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
    ),
}
_PRESET_COMMON = dict(
    model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6,
    rope_theta=1000000.0, max_position_embeddings=32768, torch_dtype="bfloat16",
    bos_token_id=151643, eos_token_id=151643, use_sliding_window=False,
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


# --------------------------------------------------------------------------- tensor math (pure)


def expected_hf_shapes(spec: ConvertSpec, rule: Rule) -> list[tuple[int, ...]]:
    d = spec.dims
    h = d.hidden_size
    if rule.kind is Kind.VOCAB:
        return [(d.vocab_size, h)]
    if rule.kind is Kind.REPLICATED:
        return [(h,)]
    if rule.kind is Kind.QKV:
        q, kv = d.num_attention_heads * d.head_dim, d.num_query_groups * d.head_dim
        if rule.mg.endswith(".bias"):
            return [(q,), (kv,), (kv,)]
        return [(q, h), (kv, h), (kv, h)]
    if rule.kind is Kind.GLU:
        return [(d.ffn_hidden_size, h)] * 2
    if rule.kind is Kind.ROW:
        if "linear_proj" in rule.mg:
            return [(h, d.num_attention_heads * d.head_dim)]
        return [(h, d.ffn_hidden_size)]
    raise AssertionError(rule.kind)


def expected_mg_shape(spec: ConvertSpec, rule: Rule, tp: int) -> tuple[int, ...]:
    """Shape of the tensor on ONE TP rank."""
    d = spec.dims
    h = d.hidden_size
    if rule.kind is Kind.VOCAB:
        return (spec.vocab_rows(tp) // tp, h)
    if rule.kind is Kind.REPLICATED:
        return (h,)
    if rule.kind is Kind.QKV:
        rows = (d.num_query_groups // tp) * (d.q_per_group + 2) * d.head_dim
        return (rows,) if rule.mg.endswith(".bias") else (rows, h)
    if rule.kind is Kind.GLU:
        return (2 * d.ffn_hidden_size // tp, h)
    if rule.kind is Kind.ROW:
        cols = d.num_attention_heads * d.head_dim if "linear_proj" in rule.mg else d.ffn_hidden_size
        return (h, cols // tp)
    raise AssertionError(rule.kind)


def split_for_tp(spec: ConvertSpec, rule: Rule, hf_tensors: list[torch.Tensor], tp: int) -> list[torch.Tensor]:
    """HF tensor(s) of one rule → the Megatron tensor of each TP rank (contiguous, fresh memory)."""
    d = spec.dims
    kind = rule.kind
    if kind is Kind.REPLICATED:
        (t,) = hf_tensors
        return [t.clone() for _ in range(tp)]
    if kind is Kind.COLUMN:
        return [c.clone() for c in hf_tensors[0].chunk(tp, dim=0)]
    if kind is Kind.ROW:
        return [c.clone(memory_format=torch.contiguous_format) for c in hf_tensors[0].chunk(tp, dim=1)]
    if kind is Kind.VOCAB:
        (t,) = hf_tensors
        rows = spec.vocab_rows(tp)
        if rows != t.shape[0]:
            t = torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))], dim=0)
        return [c.clone() for c in t.chunk(tp, dim=0)]
    if kind is Kind.QKV:
        q, k, v = hf_tensors
        g, qpg, hd = d.num_query_groups, d.q_per_group, d.head_dim
        tail = q.shape[1:]
        fused = torch.cat(
            [q.reshape(g, qpg * hd, *tail), k.reshape(g, hd, *tail), v.reshape(g, hd, *tail)], dim=1
        )  # [groups, (qpg+2)*hd, ...]
        return [c.reshape(-1, *tail).clone() for c in fused.chunk(tp, dim=0)]
    if kind is Kind.GLU:
        gate, up = hf_tensors
        return [torch.cat([gs, us], dim=0) for gs, us in zip(gate.chunk(tp, dim=0), up.chunk(tp, dim=0))]
    raise AssertionError(kind)


def merge_pieces(
    spec: ConvertSpec, rule: Rule, rank_tensors: list[torch.Tensor], *, name: str = "", where: str = ""
) -> list[list[torch.Tensor]]:
    """The Megatron tensor of every TP rank → for each HF tensor of the rule, contiguous pieces whose
    dim-0 concatenation IS that tensor.

    Pieces are views of the inputs wherever the layout allows (everything but row-parallel
    tensors), so a streaming writer can copy checkpoint bytes straight to the output file.
    """
    d = spec.dims
    kind = rule.kind
    ranks = [t if t.is_contiguous() else t.contiguous() for t in rank_tensors]
    if kind is Kind.REPLICATED:
        first = ranks[0]
        for r, t in enumerate(ranks[1:], start=1):
            if not torch.equal(first, t):
                diff = (first.float() - t.float()).abs().max().item()
                raise ConversionError(
                    f"{where}: replicated tensor {name} differs between TP rank 0 and TP rank {r} "
                    f"(max abs diff {diff:g}); the checkpoint is inconsistent"
                )
        return [[first]]
    if kind is Kind.COLUMN:
        return [ranks]
    if kind is Kind.ROW:
        return [[torch.cat(ranks, dim=1)]]
    if kind is Kind.VOCAB:
        pieces, remaining = [], d.vocab_size
        for t in ranks:  # drop the padding rows at the end
            take = min(t.shape[0], remaining)
            if take > 0:
                pieces.append(t[:take])
            remaining -= take
        return [pieces]
    if kind is Kind.QKV:
        qpg, hd = d.q_per_group, d.head_dim
        q, k, v = [], [], []
        for t in ranks:
            grouped = t.view(-1, (qpg + 2) * hd, *t.shape[1:])
            for g in range(grouped.shape[0]):
                q.append(grouped[g, : qpg * hd])
                k.append(grouped[g, qpg * hd : (qpg + 1) * hd])
                v.append(grouped[g, (qpg + 1) * hd :])
        return [q, k, v]
    if kind is Kind.GLU:
        halves = [t.chunk(2, dim=0) for t in ranks]
        return [[h[0] for h in halves], [h[1] for h in halves]]
    raise AssertionError(kind)


def merge_from_tp(
    spec: ConvertSpec, rule: Rule, rank_tensors: list[torch.Tensor], *, name: str = "", where: str = ""
) -> list[torch.Tensor]:
    """The Megatron tensor of every TP rank → the HF tensor(s) of one rule (fresh memory)."""
    return [torch.cat(p, dim=0) for p in merge_pieces(spec, rule, rank_tensors, name=name, where=where)]


def extra_state_value(spec: ConvertSpec):
    """The `_extra_state` value written next to each linear (RLinf writes a pickled None tensor)."""
    if spec.extra_state == "tensor_pickle_none":
        return torch.frombuffer(bytearray(pickle.dumps(None)), dtype=torch.uint8).clone()
    return None


# --------------------------------------------------------------------------- per-unit conversion


HFGetter = Callable[[str], torch.Tensor]


def unit_to_megatron(
    spec: ConvertSpec, unit: str, layer: int | None, get_hf: HFGetter, tp: int, pp: int
) -> tuple[int, list[dict[str, torch.Tensor]], list[str]]:
    """Convert one unit: returns (pp_rank, per-TP-rank {megatron name: tensor}, HF names consumed)."""
    pp_rank, local = unit_stage(spec, unit, layer, pp)
    out: list[dict[str, Any]] = [{} for _ in range(tp)]
    consumed: list[str] = []
    for rule in spec.rules(unit):
        names = hf_names(rule, layer)
        tensors = [get_hf(n) for n in names]
        for n, t, shape in zip(names, tensors, expected_hf_shapes(spec, rule)):
            if tuple(t.shape) != shape:
                raise ConversionError(f"HF tensor {n} has shape {tuple(t.shape)}, the config implies {shape}")
        consumed += names
        name = mg_name(rule, local, spec.te_layernorm_names)
        for r, piece in enumerate(split_for_tp(spec, rule, tensors, tp)):
            out[r][name] = piece
    if unit == "layer" and spec.extra_state != "omit":
        for module in LINEAR_MODULES:
            for r in range(tp):
                out[r][f"decoder.layers.{local}.{module}{EXTRA_STATE_SUFFIX}"] = extra_state_value(spec)
    return pp_rank, out, consumed


def tied_output_copy(spec: ConvertSpec, tp: int, pp: int, embed_shards: list[torch.Tensor]) -> dict[int, dict]:
    """With tied embeddings and PP>1 the last stage holds ``output_layer.weight`` (a copy)."""
    if not spec.dims.tie_word_embeddings or pp == 1:
        return {}
    return {r: {"output_layer.weight": embed_shards[r].clone()} for r in range(tp)}


def unit_to_hf_pieces(
    spec: ConvertSpec,
    unit: str,
    layer: int | None,
    get_mg: Callable[[int, int, str], torch.Tensor],
    tp: int,
    pp: int,
    where: Callable[[int, int], str] = lambda t, p: f"tp{t}/pp{p}",
) -> tuple[dict[str, list[torch.Tensor]], int, list[str]]:
    """Convert one unit back: ({HF name: pieces (see `merge_pieces`)}, pp_rank, Megatron names consumed).

    ``get_mg(tp_rank, pp_rank, name)`` returns a tensor or raises KeyError; both TE and local
    layer-norm names are tried. Shapes are checked against the config.
    """
    pp_rank, local = unit_stage(spec, unit, layer, pp)
    out: dict[str, list[torch.Tensor]] = {}
    consumed: list[str] = []
    for rule in spec.rules(unit):
        candidates = list(dict.fromkeys([mg_name(rule, local, te=True), mg_name(rule, local, te=False)]))
        rank_tensors = []
        used = None
        for t in range(tp):
            tensor = None
            for cand in candidates:
                try:
                    tensor = get_mg(t, pp_rank, cand)
                    used = cand
                    break
                except KeyError:
                    continue
            if tensor is None:
                raise ConversionError(
                    f"{where(t, pp_rank)}: tensor {' or '.join(candidates)} is missing "
                    f"(expected for {unit}{'' if layer is None else f' layer {layer}'})"
                )
            want = expected_mg_shape(spec, rule, tp)
            if tuple(tensor.shape) != want:
                raise ConversionError(
                    f"{where(t, pp_rank)}: {used} has shape {tuple(tensor.shape)}, expected {want} for "
                    f"TP={tp} and the HF config (wrong TP/PP or wrong --hf-template?)"
                )
            rank_tensors.append(tensor)
        consumed.append(used)
        pieces = merge_pieces(spec, rule, rank_tensors, name=used, where=where(0, pp_rank))
        for n, value in zip(hf_names(rule, layer), pieces):
            out[n] = value
    return out, pp_rank, consumed


def unit_to_hf(spec, unit, layer, get_mg, tp, pp, where=lambda t, p: f"tp{t}/pp{p}"):
    """Like `unit_to_hf_pieces`, with each HF tensor assembled in fresh memory."""
    pieces, pp_rank, consumed = unit_to_hf_pieces(spec, unit, layer, get_mg, tp, pp, where)
    return {n: torch.cat(p, dim=0) for n, p in pieces.items()}, pp_rank, consumed


# --------------------------------------------------------------------------- whole-model pure functions


def hf_to_megatron(
    hf_state: Mapping[str, torch.Tensor], spec: ConvertSpec, tp: int = 1, pp: int = 1
) -> dict[tuple[int, int], dict[str, Any]]:
    """HF state dict → ``{(tp_rank, pp_rank): megatron state dict}`` (strict: every HF tensor used)."""
    check_parallel(spec, tp, pp)

    def get_hf(name: str) -> torch.Tensor:
        if name not in hf_state:
            raise ConversionError(f"HF state has no tensor {name}")
        return hf_state[name]

    ranks: dict[tuple[int, int], dict[str, Any]] = {(t, p): {} for p in range(pp) for t in range(tp)}
    consumed: set[str] = set()
    embed_shards = None
    for unit, layer in units(spec):
        pp_rank, per_tp, names = unit_to_megatron(spec, unit, layer, get_hf, tp, pp)
        consumed.update(names)
        for t in range(tp):
            ranks[(t, pp_rank)].update(per_tp[t])
        if unit == "pre":
            embed_shards = [per_tp[t]["embedding.word_embeddings.weight"] for t in range(tp)]
    for t, extra in tied_output_copy(spec, tp, pp, embed_shards).items():
        ranks[(t, pp - 1)].update(extra)
    check_hf_leftovers(spec, hf_state.keys(), consumed, get_hf)
    return ranks


def check_hf_leftovers(spec: ConvertSpec, names: Iterable[str], consumed: set[str], get: HFGetter) -> None:
    """Every HF tensor must be consumed; a tied ``lm_head.weight`` equal to the embedding is allowed."""
    left = sorted(set(names) - consumed)
    if spec.dims.tie_word_embeddings and "lm_head.weight" in left:
        if torch.equal(get("lm_head.weight"), get("model.embed_tokens.weight")):
            left.remove("lm_head.weight")
        else:
            raise ConversionError(
                "config says tie_word_embeddings=true but lm_head.weight differs from model.embed_tokens.weight"
            )
    left = [k for k in left if not k.endswith("rotary_emb.inv_freq")]  # a buffer some old exports carry
    if left:
        raise ConversionError(f"HF tensors not consumed by the mapping (config/model mismatch?): {left}")


def megatron_to_hf(
    rank_states: Mapping[tuple[int, int], Mapping[str, Any]], spec: ConvertSpec
) -> dict[str, torch.Tensor]:
    """``{(tp_rank, pp_rank): megatron state dict}`` → HF state dict (strict: every tensor used)."""
    tp, pp = grid_of(rank_states.keys())
    check_parallel(spec, tp, pp)

    def get_mg(t: int, p: int, name: str) -> torch.Tensor:
        return rank_states[(t, p)][name]

    consumed: dict[tuple[int, int], set[str]] = {k: set() for k in rank_states}
    out: dict[str, torch.Tensor] = {}
    for unit, layer in units(spec):
        tensors, pp_rank, names = unit_to_hf(spec, unit, layer, get_mg, tp, pp)
        out.update(tensors)
        for t in range(tp):
            consumed[(t, pp_rank)].update(names)
    check_tied_copy(spec, tp, pp, lambda t: rank_states[(t, pp - 1)].get("output_layer.weight"),
                    lambda t: rank_states[(t, 0)]["embedding.word_embeddings.weight"], consumed)
    for key, state in rank_states.items():
        check_mg_leftovers(state.keys(), consumed[key], where=f"tp{key[0]}/pp{key[1]}")
    return out


def check_tied_copy(spec, tp, pp, get_copy, get_embed, consumed) -> None:
    """Tied + PP>1: the last stage's output_layer copy (if present) must equal the embedding."""
    if not spec.dims.tie_word_embeddings or pp == 1:
        return
    for t in range(tp):
        copy = get_copy(t)
        if copy is None:
            continue
        if not torch.equal(copy, get_embed(t)):
            raise ConversionError(
                f"tp{t}/pp{pp - 1}: output_layer.weight (tied copy of the embedding) differs from "
                f"tp{t}/pp0 embedding.word_embeddings.weight"
            )
        consumed[(t, pp - 1)].add("output_layer.weight")


def check_mg_leftovers(keys: Iterable[str], consumed: set[str], where: str) -> None:
    left = sorted(k for k in keys if k not in consumed and not k.endswith(EXTRA_STATE_SUFFIX))
    if left:
        raise ConversionError(
            f"{where}: Megatron tensors not consumed by the mapping (wrong TP/PP, or a model the "
            f"HF config does not describe): {left[:20]}{' ...' if len(left) > 20 else ''}"
        )


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


def merge_megatron_ranks(
    rank_states: Mapping[tuple[int, int], Mapping[str, Any]], spec: ConvertSpec
) -> dict[str, torch.Tensor]:
    """A TP×PP Megatron checkpoint as ONE TP=1/PP=1 Megatron state dict (for `--verify`).

    Works in Megatron space only — the fused QKV stays fused — so a verify built on it checks the
    HF mapping independently. Replicated tensors must agree across ranks.
    """
    tp, pp = grid_of(rank_states.keys())
    check_parallel(spec, tp, pp)
    out: dict[str, torch.Tensor] = {}
    for unit, layer in units(spec):
        pp_rank, local = unit_stage(spec, unit, layer, pp)
        for rule in spec.rules(unit):
            pieces, used = [], None
            for t in range(tp):
                state = rank_states[(t, pp_rank)]
                for cand in dict.fromkeys([mg_name(rule, local, True), mg_name(rule, local, False)]):
                    if cand in state:
                        pieces.append(state[cand])
                        used = cand
                        break
                else:
                    raise ConversionError(f"tp{t}/pp{pp_rank}: missing {mg_name(rule, local, False)}")
            if rule.kind in (Kind.COLUMN, Kind.VOCAB, Kind.QKV):
                merged = torch.cat(pieces, dim=0)
            elif rule.kind is Kind.ROW:
                merged = torch.cat(pieces, dim=1)
            elif rule.kind is Kind.GLU:
                halves = [p.chunk(2, dim=0) for p in pieces]
                merged = torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
            else:
                merged = merge_from_tp(spec, rule, pieces, name=used, where=f"pp{pp_rank}")[0]
            global_name = used if layer is None else used.replace(f"decoder.layers.{local}.", f"decoder.layers.{layer}.", 1)
            out[global_name] = merged
    return out


def check_parallel(spec: ConvertSpec, tp: int, pp: int) -> None:
    try:
        check_parallel_fits(spec.dims, tp, pp)
    except ValueError as e:
        raise ConversionError(str(e)) from None
    spec.vocab_rows(tp)


def with_spec(spec: ConvertSpec, **changes: Any) -> ConvertSpec:
    return replace(spec, **changes)


def iter_rank_keys(tp: int, pp: int) -> Iterator[tuple[int, int]]:
    for p in range(pp):
        for t in range(tp):
            yield t, p
