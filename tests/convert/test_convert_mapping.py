"""The mapping table's tensor math, hand-computed on toy dimensions, and in-memory round trips."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rlinf_ext.convert.mapping import QWEN2_TABLE, ConversionError, ConvertSpec, Kind, grid_of, preset_hf_config
from rlinf_ext.convert.state_dicts import hf_to_megatron, megatron_to_hf, merge_megatron_ranks
from rlinf_ext.convert.tensor_math import merge_from_tp, split_for_tp
from rlinf_ext.models.qwen2 import adapt_layernorm_names

TOY = dict(
    model_type="qwen2",
    num_hidden_layers=2,
    hidden_size=4,
    intermediate_size=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=1,
    vocab_size=5,
    tie_word_embeddings=False,
)


def rule(mg_suffix: str):
    return next(r for unit in QWEN2_TABLE.values() for r in unit if r.mg.endswith(mg_suffix))


def rows(t: torch.Tensor) -> list[float]:
    return t[:, 0].tolist() if t.dim() == 2 else t.tolist()


def test_qkv_is_fused_per_kv_group_and_split_by_group():
    spec = ConvertSpec.from_hf_config(TOY)
    # 4 q heads, 2 kv groups, head_dim 1: q rows 10..13, k rows 20,21, v rows 30,31
    q = torch.tensor([10.0, 11, 12, 13])[:, None].repeat(1, 4)
    k = torch.tensor([20.0, 21])[:, None].repeat(1, 4)
    v = torch.tensor([30.0, 31])[:, None].repeat(1, 4)
    r = rule("linear_qkv.weight")
    (full,) = split_for_tp(spec, r, [q, k, v], tp=1)
    assert rows(full) == [10, 11, 20, 30, 12, 13, 21, 31]
    r0, r1 = split_for_tp(spec, r, [q, k, v], tp=2)
    assert rows(r0) == [10, 11, 20, 30] and rows(r1) == [12, 13, 21, 31]
    back = merge_from_tp(spec, r, [r0, r1])
    assert all(torch.equal(a, b) for a, b in zip(back, [q, k, v]))
    # the bias follows the same grouping
    rb = rule("linear_qkv.bias")
    b0, b1 = split_for_tp(spec, rb, [q[:, 0], k[:, 0], v[:, 0]], tp=2)
    assert b0.tolist() == [10, 11, 20, 30] and b1.tolist() == [12, 13, 21, 31]


def test_fc1_ranks_hold_gate_shard_then_up_shard():
    spec = ConvertSpec.from_hf_config(TOY)
    gate = torch.tensor([0.0, 1, 2, 3])[:, None]
    up = torch.tensor([10.0, 11, 12, 13])[:, None]
    r = rule("linear_fc1.weight")
    r0, r1 = split_for_tp(spec, r, [gate, up], tp=2)
    assert rows(r0) == [0, 1, 10, 11] and rows(r1) == [2, 3, 12, 13]
    g, u = merge_from_tp(spec, r, [r0, r1])
    assert torch.equal(g, gate) and torch.equal(u, up)


def test_row_parallel_splits_columns_and_vocab_is_padded():
    spec = ConvertSpec.from_hf_config(TOY, padded_vocab_size=6)
    w = torch.arange(8.0).reshape(2, 4)
    a, b = split_for_tp(spec, rule("linear_fc2.weight"), [w], tp=2)
    assert a.tolist() == [[0, 1], [4, 5]] and b.tolist() == [[2, 3], [6, 7]]
    emb = torch.arange(5.0)[:, None].repeat(1, 4)
    e0, e1 = split_for_tp(spec, rule("word_embeddings.weight"), [emb], tp=2)
    assert rows(e0) == [0, 1, 2] and rows(e1) == [3, 4, 0]  # one zero padding row
    (merged,) = merge_from_tp(spec, rule("word_embeddings.weight"), [e0, e1])
    assert torch.equal(merged, emb)


def test_replicated_tensors_that_differ_are_an_error():
    spec = ConvertSpec.from_hf_config(TOY)
    r = rule("final_layernorm.weight")
    assert r.kind is Kind.REPLICATED
    with pytest.raises(
        ConversionError,
        match="replicated tensor decoder.final_layernorm.weight differs between TP rank 0 and TP rank 1",
    ):
        merge_from_tp(spec, r, [torch.ones(4), torch.ones(4) * 2], name="decoder.final_layernorm.weight", where="x")


def test_layernorm_names_translate_both_ways():
    local = {
        "decoder.layers.3.input_layernorm.weight": 1,
        "decoder.layers.3.pre_mlp_layernorm.weight": 2,
        "decoder.final_layernorm.weight": 3,
    }
    te = adapt_layernorm_names(local, to_te=True)
    assert set(te) == {
        "decoder.layers.3.self_attention.linear_qkv.layer_norm_weight",
        "decoder.layers.3.mlp.linear_fc1.layer_norm_weight",
        "decoder.final_layernorm.weight",
    }
    assert adapt_layernorm_names(te, to_te=False) == local


def _random_hf_state(spec: ConvertSpec, dtype=torch.float32) -> dict[str, torch.Tensor]:
    from rlinf_ext.convert.mapping import hf_names, units
    from rlinf_ext.convert.tensor_math import expected_hf_shapes

    gen = torch.Generator().manual_seed(0)
    state = {}
    for unit, layer in units(spec):
        for r in spec.rules(unit):
            for n, shape in zip(hf_names(r, layer), expected_hf_shapes(spec, r)):
                state[n] = torch.randn(shape, generator=gen).to(dtype)
    return state


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_in_memory_round_trip_is_bit_exact(tp, pp, tied):
    spec = ConvertSpec.from_hf_config({**TOY, "tie_word_embeddings": tied})
    hf = _random_hf_state(spec, torch.bfloat16)
    ranks = hf_to_megatron(hf, spec, tp, pp)
    assert set(ranks) == {(t, p) for t in range(tp) for p in range(pp)}
    # with PP=2 each stage holds one layer, numbered locally from 0
    assert "decoder.layers.0.mlp.linear_fc2.weight" in ranks[(0, pp - 1)]
    assert ("output_layer.weight" in ranks[(0, pp - 1)]) == (not tied or pp > 1)
    back = megatron_to_hf(ranks, spec)
    assert set(back) == set(hf)
    assert all(torch.equal(back[k], hf[k]) and back[k].dtype == hf[k].dtype for k in hf)
    # merging in Megatron space gives exactly the TP=1/PP=1 checkpoint (what --verify loads)
    merged = merge_megatron_ranks(ranks, spec)
    same_rows = replace(spec, padded_vocab_size=spec.vocab_rows(tp))  # vocab 5 is padded to 6 rows for TP=2
    single = {k: v for k, v in hf_to_megatron(hf, same_rows, 1, 1)[(0, 0)].items() if not k.endswith("_extra_state")}
    assert set(merged) == set(single)
    assert all(torch.equal(merged[k], single[k]) for k in single)


def test_strictness_of_the_pure_functions():
    spec = ConvertSpec.from_hf_config(TOY)
    hf = _random_hf_state(spec)
    with pytest.raises(ConversionError, match="not consumed by the mapping.*model.layers.0.mlp.extra.weight"):
        hf_to_megatron({**hf, "model.layers.0.mlp.extra.weight": torch.ones(1)}, spec)
    ranks = hf_to_megatron(hf, spec, 2, 1)
    ranks[(1, 0)]["decoder.layers.0.self_attention.rogue.weight"] = torch.ones(1)
    with pytest.raises(ConversionError, match="tp1/pp0: Megatron tensors not consumed.*rogue"):
        megatron_to_hf(ranks, spec)
    del ranks[(1, 0)]["decoder.layers.0.self_attention.rogue.weight"]
    ranks[(1, 0)]["decoder.layers.1.mlp.linear_fc2.weight"] = torch.ones(4, 3)
    with pytest.raises(
        ConversionError,
        match="tp1/pp0: decoder.layers.1.mlp.linear_fc2.weight has shape \\(4, 3\\), expected \\(4, 2\\)",
    ):
        megatron_to_hf(ranks, spec)
    with pytest.raises(ConversionError, match="missing Megatron ranks"):
        grid_of([(0, 0), (1, 1)])
    with pytest.raises(ConversionError, match="num_key_value_heads=2 is not divisible by TP=4"):
        hf_to_megatron(hf, spec, 4, 1)
    tied = ConvertSpec.from_hf_config({**TOY, "tie_word_embeddings": True})
    hf_tied = {k: v for k, v in hf.items()}
    with pytest.raises(ConversionError, match="lm_head.weight differs from model.embed_tokens.weight"):
        hf_to_megatron(hf_tied, tied)
    hf_tied["lm_head.weight"] = hf_tied["model.embed_tokens.weight"].clone()
    assert "output_layer.weight" not in hf_to_megatron(hf_tied, tied)[(0, 0)]


def test_presets_have_the_published_dimensions():
    from rlinf_ext.models.qwen2 import dims_from_hf_config

    d = dims_from_hf_config(preset_hf_config("Qwen2.5-3B"))
    assert (d.num_layers, d.hidden_size, d.num_attention_heads, d.num_query_groups, d.head_dim, d.vocab_size) == (
        36,
        2048,
        16,
        2,
        128,
        151936,
    )
    assert d.tie_word_embeddings
    assert not dims_from_hf_config(preset_hf_config("qwen2.5-7b")).tie_word_embeddings
    with pytest.raises(ConversionError, match="unknown preset"):
        preset_hf_config("qwen9")
