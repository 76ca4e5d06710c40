"""Whole-model and per-layer conversion of state dicts, driven by the table in ``convert/mapping.py``:
``hf_to_megatron`` (HF -> one Megatron state dict per TP/PP rank), ``megatron_to_hf``, ``merge_megatron_ranks``, with
strict checks that every tensor is used once. The converters (``convert/hf2mg.py``, ``convert/mg2hf.py``) stream the
same per-layer functions; the actor converts in memory at start and for weight sync."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from rlinf_ext.convert.mapping import (
    EXTRA_STATE_SUFFIX,
    LINEAR_MODULES,
    ConversionError,
    ConvertSpec,
    Kind,
    check_parallel,
    grid_of,
    hf_names,
    mg_name,
    unit_stage,
    units,
)
from rlinf_ext.convert.tensor_math import (
    expected_hf_shapes,
    expected_mg_shape,
    extra_state_value,
    merge_from_tp,
    merge_pieces,
    split_for_tp,
)

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
    return dict(iter_megatron_to_hf(rank_states, spec))


def iter_megatron_to_hf(
    rank_states: Mapping[tuple[int, int], Mapping[str, Any]], spec: ConvertSpec
) -> Iterator[tuple[str, torch.Tensor]]:
    """``megatron_to_hf`` one unit (embedding, each layer, final norm and head) at a time, as ``(HF name,
    tensor)`` pairs: the whole HF state is never held at once (the actor's weight sync streams it into
    buckets). The strictness checks run once every unit has been yielded. ``rank_states`` values only need
    ``__getitem__``, ``get`` and ``keys()`` (a view that moves or casts tensors on access works)."""
    tp, pp = grid_of(rank_states.keys())
    check_parallel(spec, tp, pp)

    def get_mg(t: int, p: int, name: str) -> torch.Tensor:
        return rank_states[(t, p)][name]

    consumed: dict[tuple[int, int], set[str]] = {k: set() for k in rank_states}
    for unit, layer in units(spec):
        tensors, pp_rank, names = unit_to_hf(spec, unit, layer, get_mg, tp, pp)
        yield from tensors.items()
        for t in range(tp):
            consumed[(t, pp_rank)].update(names)
    check_tied_copy(
        spec,
        tp,
        pp,
        lambda t: rank_states[(t, pp - 1)].get("output_layer.weight"),
        lambda t: rank_states[(t, 0)]["embedding.word_embeddings.weight"],
        consumed,
    )
    for key, state in rank_states.items():
        check_mg_leftovers(state.keys(), consumed[key], where=f"tp{key[0]}/pp{key[1]}")


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
            global_name = (
                used if layer is None else used.replace(f"decoder.layers.{local}.", f"decoder.layers.{layer}.", 1)
            )
            out[global_name] = merged
    return out
