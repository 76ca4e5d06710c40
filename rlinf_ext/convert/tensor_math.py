"""Tensor math of the Megatron <-> HF conversion (pure): the shapes each table row expects, and how a tensor is
split over tensor-parallel ranks and merged back (fused QKV per KV group, ``[gate; up]`` per rank, vocab-padded
embeddings). ``convert/mapping.py`` holds the table these functions read."""

from __future__ import annotations

import pickle

import torch

from rlinf_ext.convert.mapping import ConversionError, ConvertSpec, Kind, Rule


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
