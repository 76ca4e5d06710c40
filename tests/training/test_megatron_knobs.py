"""The actor's Megatron knobs reach Megatron-core: recompute settings change what the forward keeps for the
backward (and nothing else), fusion switches land in the TransformerConfig, actor.spec_name picks the layer spec,
and fused AdamW is what the CUDA optimizer steps with."""

import pytest
import torch

from rlinf_ext.models import megatron as mg
from rlinf_ext.training.grpo_policy import Sample
from rlinf_ext.training.megatron_policy import MegatronPolicy
from rlinf_ext.training.optimizer import use_fused_adamw
from rlinf_ext.training.rl_math import LossConfig
from rlinf_ext.training.settings import ActorSettings, transformer_overrides

pytestmark = pytest.mark.timeout(300)

FULL_UNIFORM = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


def _samples(vocab, n=4, length=40):
    g = torch.Generator().manual_seed(0)
    return [
        Sample(
            torch.randint(3, vocab, (6,), generator=g).tolist(),
            torch.randint(3, vocab, (length,), generator=g).tolist(),
            [1] * length,
            reward=float(i % 2),
        )
        for i in range(n)
    ]


def _saved_bytes_and_grads(model_dir, overrides):
    """Bytes autograd keeps for the backward of one micro-batch, the loss and the gradients."""
    policy = MegatronPolicy(model_dir, ActorSettings(group_size=2, model_overrides=overrides, loss=LossConfig()))
    samples = _samples(policy.model.hf_vocab_size)
    policy.recompute(samples, compute_ref=False)
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    policy.step.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = policy._micro_loss(samples, torch.tensor([1.0, -1.0, 0.5, -0.5]), 100.0)
    loss.backward()
    return policy, sum(saved), loss.item(), {k: g.clone() for k, g in policy.gradients().items()}


def test_recompute_keys_reach_megatron_and_only_change_memory(tiny_assets):
    plain, plain_bytes, plain_loss, plain_grads = _saved_bytes_and_grads(tiny_assets.qwen2_tiny, {})
    full, full_bytes, full_loss, full_grads = _saved_bytes_and_grads(tiny_assets.qwen2_tiny, FULL_UNIFORM)
    assert plain.model.config.recompute_granularity is None
    assert (
        full.model.config.recompute_granularity,
        full.model.config.recompute_method,
        full.model.config.recompute_num_layers,
    ) == ("full", "uniform", 1)
    print(f"bytes kept for the backward: {plain_bytes} without recompute, {full_bytes} with full recompute")
    assert full_bytes < 0.5 * plain_bytes  # each layer keeps only its input
    assert full_loss == pytest.approx(plain_loss, abs=1e-7)
    assert all(torch.allclose(full_grads[k], plain_grads[k], atol=1e-7) for k in plain_grads)


def test_actor_model_keys_become_transformer_config_fields(tiny_assets):
    from rlinf_ext.config import load_config

    cfg = load_config(
        "tiny-cpu",
        [
            "actor.model.recompute_granularity=full",
            "actor.model.recompute_method=block",
            "actor.model.recompute_num_layers=2",
            "actor.model.attention_softmax_in_fp32=false",
            f"paths.tiny_assets={tiny_assets.root}",
        ],
        strict=False,
    )
    overrides = transformer_overrides(cfg.actor.model)
    assert overrides["recompute_method"] == "block" and overrides["attention_softmax_in_fp32"] is False
    config = mg.transformer_config_from_hf(tiny_assets.qwen2_tiny, tp=1, pp=1, **overrides)
    for key, value in overrides.items():
        expected = True if key == "use_cpu_initialization" else value  # forced on CPU
        assert getattr(config, key) == expected, key


def test_spec_name_picks_the_layer_spec_and_refuses_decoder_gpt_without_te_on_cuda(monkeypatch):
    assert mg.layer_spec_uses_te("local_gpt") is False
    assert mg.layer_spec_uses_te("decoder_gpt") is False  # CPU: Megatron's local layers
    monkeypatch.setattr(mg, "cpu_mode", lambda: False)
    monkeypatch.setattr(mg, "te_available", lambda: False)
    with pytest.raises(RuntimeError, match="actor.spec_name=local_gpt"):
        mg.layer_spec_uses_te("decoder_gpt")
    monkeypatch.setattr(mg, "te_available", lambda: True)
    assert mg.layer_spec_uses_te("decoder_gpt") is True
    with pytest.raises(ValueError, match="actor.spec_name"):
        mg.layer_spec_uses_te("gpt")


def test_fused_adamw_switch_gives_the_fused_kernel_bit_for_bit():
    """torch's fused AdamW runs on CPU too, so the switch made on the CUDA optimizer is checked here."""

    def run(make):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(7, 5))
        opt = make([w])
        for i in range(3):
            w.grad = torch.randn(7, 5, generator=torch.Generator().manual_seed(i))
            opt.step()
        return w.detach(), opt

    def switched(p):
        opt = torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1)
        use_fused_adamw(opt)
        return opt

    w_switched, opt = run(switched)
    w_fused, _ = run(lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True))
    w_foreach, _ = run(lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True))
    assert opt.param_groups[0]["fused"] and torch.equal(w_switched, w_fused)
    assert torch.allclose(w_switched, w_foreach, atol=1e-6)
    assert not use_fused_adamw(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))
    assert not use_fused_adamw(opt)  # already stepped: its state exists
