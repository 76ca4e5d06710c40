"""Megatron-core GPTModel for Qwen2 from a HF config: dims, masks, strict loading, logits equal to HF."""

from __future__ import annotations

import json

import pytest
import torch

from rlinf_ext.convert.mapping import ConvertSpec
from rlinf_ext.convert.state_dicts import hf_to_megatron
from rlinf_ext.models.cpu_shims import parallel_state_session
from rlinf_ext.models.megatron import (
    StateDictMismatch,
    build_gpt_model,
    causal_padding_mask,
    default_position_ids,
    forward_logits,
    load_megatron_state_dict,
)
from rlinf_ext.models.qwen2 import check_parallel_fits, default_padded_vocab_size, dims_from_hf_config

# fp32 on CPU: the two implementations differ only by summation order.
LOGIT_ATOL = 1e-4


def test_dims_from_tiny_config(tiny_assets):
    d = dims_from_hf_config(tiny_assets.qwen2_tiny)
    assert (d.num_layers, d.hidden_size, d.num_attention_heads, d.num_query_groups, d.head_dim) == (2, 64, 2, 1, 32)
    assert d.q_per_group == 2 and d.tie_word_embeddings and d.qkv_bias
    assert not dims_from_hf_config(tiny_assets.qwen2_tiny_untied).tie_word_embeddings


def test_unsupported_model_and_bad_parallel_are_named():
    with pytest.raises(ValueError, match="model_type 'llama' is not supported"):
        dims_from_hf_config({"model_type": "llama"})
    d = dims_from_hf_config(
        dict(
            model_type="qwen2",
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=64,
            intermediate_size=176,
            num_hidden_layers=3,
            vocab_size=100,
        )
    )
    with pytest.raises(ValueError, match="num_key_value_heads=2 is not divisible by TP=4"):
        check_parallel_fits(d, 4, 1)
    with pytest.raises(ValueError, match="num_hidden_layers=3 is not divisible by PP=2"):
        check_parallel_fits(d, 1, 2)


def test_masks_and_positions_hand_computed():
    am = torch.tensor([[0, 1, 1]])
    mask = causal_padding_mask(am, 3, 1)[0, 0]
    # True = masked: column 0 is padding for every query, plus the causal upper triangle
    assert mask.tolist() == [[True, True, True], [True, False, True], [True, False, False]]
    assert default_position_ids(am, 1, 3).tolist() == [[0, 0, 1]]
    assert default_position_ids(None, 2, 3).tolist() == [[0, 1, 2], [0, 1, 2]]
    assert default_padded_vocab_size(151936, 2) == 151936
    assert default_padded_vocab_size(151937, 2, divisible_by=128) == 152064  # 594 * 256


def test_the_padding_mask_is_built_on_the_attention_masks_device():
    """On a GPU the causal part was built on the CPU and `|` with a CUDA padding mask raised (H100, gpu_smoke
    S2); a meta-device mask shows the same without a GPU."""
    mask = causal_padding_mask(torch.ones(2, 5, dtype=torch.long, device="meta"), 5, 2)
    assert mask.device.type == "meta" and mask.shape == (2, 1, 5, 5)


def test_every_parameter_is_in_params_dtype(tiny_assets):
    """The local spec's torch norms were created fp32 next to bf16 linears; Megatron's DistributedOptimizer
    then mis-ordered its main parameters (save_parameter_state and offload_to_cpu failed on an H100)."""
    with parallel_state_session(1, 1):
        model = build_gpt_model(tiny_assets.qwen2_tiny, params_dtype=torch.bfloat16, use_te=False)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert any("layernorm" in n for n in dtypes) and set(dtypes.values()) == {torch.bfloat16}, dtypes


@pytest.mark.timeout(120)
def test_logits_match_hf_in_process(qwen2_pair):
    mode, hf = qwen2_pair
    spec = ConvertSpec.from_hf_config(hf.config, te_layernorm_names=True)  # TE names, translated on load
    ranks = hf_to_megatron(hf.state_dict(), spec, tp=1, pp=1)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, hf.config.vocab_size, (3, 9), generator=gen)
    am = torch.ones_like(ids)
    am[1, :3] = 0  # left padding
    with parallel_state_session(1, 1):
        model = build_gpt_model(hf.config, init_weights=False)
        assert model.share_embeddings_and_output_weights == (mode == "tied")
        load_megatron_state_dict(model, ranks[(0, 0)])
        mg_logits = forward_logits(model, ids, attention_mask=am)
    with torch.no_grad():
        hf_logits = hf(input_ids=ids, attention_mask=am, position_ids=default_position_ids(am, 3, 9)).logits
    assert mg_logits.shape == hf_logits.shape == (3, 9, hf.config.vocab_size)
    real = am.bool()
    assert (mg_logits - hf_logits)[real].abs().max().item() < LOGIT_ATOL
    # sanity: the comparison is sensitive (a perturbed norm changes the logits by far more)
    assert hf_logits[real].std().item() > 100 * LOGIT_ATOL


@pytest.mark.timeout(120)
def test_load_rejects_missing_and_misshaped_tensors(tiny_assets):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_assets.qwen2_tiny)
    with parallel_state_session(1, 1):
        model = build_gpt_model(cfg, init_weights=False)
        sd = {k: v for k, v in model.state_dict().items()}
        del sd["decoder.layers.1.mlp.linear_fc2.weight"]
        with pytest.raises(StateDictMismatch, match="missing keys: \\['decoder.layers.1.mlp.linear_fc2.weight'\\]"):
            load_megatron_state_dict(model, sd, source="rank 0")
        sd = dict(model.state_dict())
        sd["decoder.final_layernorm.weight"] = torch.ones(65)
        with pytest.raises(
            StateDictMismatch, match="decoder.final_layernorm.weight: checkpoint \\(65,\\) vs model \\(64,\\)"
        ):
            load_megatron_state_dict(model, sd)
        sd = dict(model.state_dict())
        sd["decoder.layers.9.mlp.linear_fc2.weight"] = torch.ones(1)
        with pytest.raises(StateDictMismatch, match="unexpected keys"):
            load_megatron_state_dict(model, sd)


@pytest.mark.timeout(180)
def test_rope_theta_1e6_reaches_megatron_and_the_converter(tiny_assets, randomized_qwen2, tmp_path):
    """transformers 5 writes the RoPE base under `rope_parameters` (no top-level `rope_theta`): a model built with
    1e6 must convert and run with 1e6, not silently with the 10000 default."""
    from transformers import AutoConfig, Qwen2ForCausalLM

    from rlinf_ext.convert.mapping import preset_hf_config

    cfg = AutoConfig.from_pretrained(tiny_assets.qwen2_tiny)
    cfg.rope_parameters = {**(cfg.rope_parameters or {}), "rope_type": "default", "rope_theta": 1e6}
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "theta1e6")
    hf = randomized_qwen2(tmp_path / "theta1e6", 3)
    assert hf.config.rope_parameters["rope_theta"] == 1e6

    written = json.loads((tmp_path / "theta1e6" / "config.json").read_text())
    assert written.get("rope_theta") is None and written["rope_parameters"]["rope_theta"] == 1e6  # the 5.x layout
    for source in (tmp_path / "theta1e6", hf.config, written):
        assert dims_from_hf_config(source).rope_theta == 1e6, source
    assert dims_from_hf_config({**written, "rope_parameters": None, "rope_theta": 5e5}).rope_theta == 5e5  # 4.x file
    assert dims_from_hf_config(preset_hf_config("qwen2.5-3b")).rope_theta == 1e6
    spec = ConvertSpec.from_hf_config(tmp_path / "theta1e6")
    assert spec.dims.rope_theta == 1e6
    ranks = hf_to_megatron(hf.state_dict(), spec, tp=1, pp=1)
    ids = torch.randint(0, 500, (2, 48), generator=torch.Generator().manual_seed(2))
    with parallel_state_session(1, 1):
        model = build_gpt_model(tmp_path / "theta1e6", init_weights=False)
        load_megatron_state_dict(model, ranks[(0, 0)])
        mg_logits = forward_logits(model, ids)
    with torch.no_grad():
        hf_logits = hf(input_ids=ids).logits
    assert (mg_logits - hf_logits).abs().max().item() < LOGIT_ATOL
