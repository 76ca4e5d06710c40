"""Hand-computed checks of the GRPO math (advantages, clipped loss, low_var_kl, token-mean, masks)."""

import math

import pytest
import torch

from rlinf_ext.training.rl_math import (
    LossConfig,
    compute_advantages,
    grpo_actor_loss,
    low_var_kl,
    token_mean,
)


def test_grpo_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    mask = torch.ones(8, 3)
    mask[0, 2] = 0
    adv = compute_advantages(rewards, mask, group_size=4, adv_type="grpo")
    # group 1: mean .25, unbiased std .5 -> [1.5, -.5, -.5, -.5]; group 2: mean .5, std sqrt(1/3)
    s = math.sqrt(1 / 3)
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s])
    assert torch.allclose(adv[:, 0], expected, atol=1e-4)
    assert adv[0, 2] == 0  # masked token carries no advantage
    assert torch.allclose(adv[1], torch.full((3,), -0.5), atol=1e-4)


def test_grpo_dynamic_trajectory_mode_equals_grpo_for_one_row_per_trajectory():
    rewards = torch.tensor([0.2, 0.9, 0.4, 0.4])
    mask = torch.ones(4, 5)
    a = compute_advantages(rewards, mask, 2, adv_type="grpo")
    b = compute_advantages(rewards, mask, 2, adv_type="grpo_dynamic", advantage_mode="trajectory")
    assert torch.allclose(a, b, atol=1e-6)
    # equal rewards in a group -> zero advantage (std 0 guarded by 1e-6)
    assert torch.all(a[2:] == 0)


def test_advantages_reject_bad_input():
    with pytest.raises(ValueError, match="adv_type"):
        compute_advantages(torch.zeros(4), torch.ones(4, 2), 2, adv_type="ppo")
    with pytest.raises(ValueError, match="group_size"):
        compute_advantages(torch.zeros(3), torch.ones(3, 2), 2)


def test_token_mean_with_mask():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]])
    assert token_mean(values, mask).item() == pytest.approx(8 / 3)
    # explicit mini-batch denominator: two micro-batches sum to the mini-batch mean
    total = token_mean(values[:1], mask[:1], 3) + token_mean(values[1:], mask[1:], 3)
    assert total.item() == pytest.approx(8 / 3)


def test_low_var_kl_hand_computed():
    lp = torch.tensor([0.0, -1.0])
    ref = torch.tensor([math.log(2.0), -1.0])
    kl = low_var_kl(lp, ref)
    assert kl[0].item() == pytest.approx(2.0 - math.log(2.0) - 1.0, abs=1e-6)
    assert kl[1].item() == 0.0


def test_clipped_loss_hand_computed():
    cfg = LossConfig(ratio_clip_eps=0.2)
    old = torch.zeros(1, 2)
    lp = torch.tensor([[math.log(1.5), math.log(1.5)]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, metrics = grpo_actor_loss(lp, old, adv, mask, cfg)
    # token 0: adv>0, ratio 1.5 clipped to 1.2 -> -1.2 (no grad); token 1: adv<0 -> max(1.5, 1.2) = 1.5
    assert loss.item() == pytest.approx((-1.2 + 1.5) / 2, abs=1e-6)
    loss.backward()
    assert lp.grad[0, 0].item() == 0.0
    assert lp.grad[0, 1].item() == pytest.approx(1.5 / 2, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(0.5)


def test_dual_clip_caps_negative_advantage_loss():
    cfg = LossConfig(ratio_clip_eps=0.2, clip_ratio_c=3.0)
    lp = torch.tensor([[math.log(4.0)]])
    loss, _ = grpo_actor_loss(lp, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(3.0)  # min(max(4, 1.2), 3)


def test_kl_and_entropy_terms_added():
    cfg = LossConfig(ratio_clip_eps=0.2, kl_beta=0.5, entropy_bonus=0.1)
    lp = torch.zeros(1, 1)
    ref = torch.tensor([[math.log(2.0)]])
    ent = torch.tensor([[2.0]])
    loss, m = grpo_actor_loss(lp, lp.clone(), torch.zeros(1, 1), torch.ones(1, 1), cfg, ref_logprobs=ref, entropy=ent)
    assert m["kl"] == pytest.approx(1 - math.log(2.0), abs=1e-6)
    assert loss.item() == pytest.approx(0.5 * (1 - math.log(2.0)) - 0.1 * 2.0, abs=1e-6)
    with pytest.raises(ValueError, match="reference"):
        grpo_actor_loss(lp, lp, torch.zeros(1, 1), torch.ones(1, 1), cfg)


def test_masked_tokens_get_exactly_zero_gradient():
    torch.manual_seed(0)
    cfg = LossConfig(ratio_clip_eps=0.2, clip_ratio_c=3.0, kl_beta=0.1, entropy_bonus=0.01)
    lp = (torch.randn(3, 6) * 0.3 - 1).requires_grad_()
    ent = torch.rand(3, 6).requires_grad_()
    old = lp.detach() + 0.1 * torch.randn(3, 6)
    ref = lp.detach() + 0.1 * torch.randn(3, 6)
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 0, 0, 1, 1, 1], [1, 0, 1, 0, 1, 0]])
    # garbage (even inf) at masked positions must not leak into the gradient
    lp_in = torch.where(mask.bool(), lp, torch.full_like(lp, float("inf")))
    adv = torch.randn(3, 6) * mask
    loss, _ = grpo_actor_loss(lp_in, old, adv, mask, cfg, ref_logprobs=ref, entropy=ent)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.all(lp.grad[mask == 0] == 0)
    assert torch.all(ent.grad[mask == 0] == 0)
    assert torch.all(lp.grad[mask == 1] != 0)
