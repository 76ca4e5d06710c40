"""Hand-computed checks of the GRPO math (advantages, clipped loss, low_var_kl, token-mean, masks) and of the
decoupled PPO behaviour weights."""

import math

import pytest
import torch

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.training.rl_math import (
    LossConfig,
    behaviour_weights,
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


# ---------------------------------------------------------------------------------------- decoupled PPO (off-policy)
# A 2x4 toy batch: row 0 is a trajectory with advantage +1 whose last column is an observation token (mask 0, engine
# log-prob 0.0); row 1 has advantage -2 and an observation in column 1. On the 6 loss tokens the behaviour weights
# w = pi_prox / pi_behav are 1, 3, 0.25 | 0.5, 1.5, 2; the trained policy equals the proximal one except at (0, 1),
# where its ratio is 1.5 (clipped to 1.2 for a positive advantage).
TOY_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]])
TOY_W = torch.tensor([[1.0, 3.0, 0.25, 1.0], [0.5, 1.0, 1.5, 2.0]])


def _toy():
    prox = torch.full((2, 4), -1.0)
    behav = torch.where(TOY_MASK.bool(), prox - TOY_W.log(), 0.0)
    lp = prox.clone()
    lp[0, 1] += math.log(1.5)
    adv = torch.tensor([[1.0], [-2.0]]) * TOY_MASK
    return lp.requires_grad_(), prox, behav, adv


def _off_policy(mode, **kw):
    return LossConfig(ratio_clip_eps=0.2, behaviour_weight=mode, **kw)


def test_behaviour_weights_truncate_hand_computed():
    _, prox, behav, _ = _toy()
    w, m = behaviour_weights(prox, behav, TOY_MASK, "truncate", cap=2.0, floor=0.5)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 0.25, 0.0], [0.5, 0.0, 1.5, 2.0]]), atol=1e-6)
    assert m["behaviour_weight_mean"] == pytest.approx(7.25 / 6, abs=1e-6)
    assert m["behaviour_weight_clip_fraction"] == pytest.approx(1 / 6)  # only the 3.0 (2.0 is not above the cap)
    # k3 = w - 1 - ln w per token: 0, 2 - ln 3, -0.75 + ln 4, -0.5 + ln 2, 0.5 - ln 1.5, 1 - ln 2
    assert m["behaviour_kl"] == pytest.approx((2.25 + math.log(8 / 9)) / 6, abs=1e-6)


def test_behaviour_weights_mask_hand_computed():
    _, prox, behav, _ = _toy()
    w, m = behaviour_weights(prox, behav, TOY_MASK, "mask", cap=2.0, floor=0.5)
    # 3.0 above the cap and 0.25 below the floor are masked; 0.5 and 2.0 are on the edges, kept
    assert torch.allclose(w, torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.0, 1.5, 2.0]]), atol=1e-6)
    assert m["behaviour_weight_mean"] == pytest.approx(5 / 6, abs=1e-6)
    assert m["behaviour_weight_clip_fraction"] == pytest.approx(2 / 6)
    # the KL estimate is of the raw weights, whatever the mode
    assert m["behaviour_kl"] == pytest.approx((2.25 + math.log(8 / 9)) / 6, abs=1e-6)
    w_none, m_none = behaviour_weights(prox, behav, TOY_MASK, "none", cap=2.0, floor=0.5)
    assert torch.equal(w_none, TOY_MASK.float())
    assert m_none["behaviour_weight_mean"] == 1.0 and m_none["behaviour_weight_clip_fraction"] == 0.0
    with pytest.raises(ValueError, match="behaviour_weight='tis'"):
        behaviour_weights(prox, behav, TOY_MASK, "tis", cap=2.0, floor=0.5)


def test_behaviour_metric_names_are_the_protocol_keys():
    _, prox, behav, _ = _toy()
    _, m = behaviour_weights(prox, behav, TOY_MASK, "truncate", cap=2.0, floor=0.5)
    assert {f"actor/{k}" for k in m} == set(mk.ACTOR_BEHAVIOUR_METRICS)


@pytest.mark.parametrize(
    "mode, expected, grads",
    [
        # per loss token -A * w * clip(r); (0, 1): max(-1.5, -1.2) = -1.2 (no gradient). Denominator: 6 loss tokens.
        (
            "truncate",
            (-1.0 - 1.2 * 2.0 - 0.25 + 2 * (0.5 + 1.5 + 2.0)) / 6,
            [[-1.0, 0.0, -0.25, 0.0], [2 * 0.5, 0.0, 2 * 1.5, 2 * 2.0]],
        ),
        ("mask", (-1.0 + 2 * (0.5 + 1.5 + 2.0)) / 6, [[-1.0, 0.0, 0.0, 0.0], [2 * 0.5, 0.0, 2 * 1.5, 2 * 2.0]]),
        ("none", (-1.0 - 1.2 - 1.0 + 2 * 3) / 6, [[-1.0, 0.0, -1.0, 0.0], [2.0, 0.0, 2.0, 2.0]]),
    ],
)
def test_decoupled_loss_hand_computed(mode, expected, grads):
    lp, prox, behav, adv = _toy()
    loss, metrics = grpo_actor_loss(lp, prox, adv, TOY_MASK, _off_policy(mode), behaviour_logprobs=behav)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()  # d/dlp of -A w r at r = 1 is -A w (divided by the 6 loss tokens)
    assert torch.allclose(lp.grad, torch.tensor(grads) / 6, atol=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(1 / 6)  # of the ratio pi / pi_prox, not of the weight
    assert ("behaviour_weight_mean" in metrics) == (mode != "none")


def _random_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(3, 7, generator=g) > 0.3).long()
    prox = -1 - torch.rand(3, 7, generator=g)
    lp = (prox + 0.3 * torch.randn(3, 7, generator=g)).requires_grad_()
    adv = torch.randn(3, 1, generator=g) * mask
    ref = prox + 0.1 * torch.randn(3, 7, generator=g)
    ent = torch.rand(3, 7, generator=g)
    return lp, prox, adv, mask, ref, ent


@pytest.mark.parametrize("mode", ["truncate", "mask", "none"])
def test_loss_equals_todays_when_behaviour_equals_proximal(mode):
    """pi_behav = pi_prox: w = 1 on every loss token, so the loss, its gradient and the loss metrics are today's, bit
    for bit (dual clip, KL and entropy terms on)."""
    base = dict(ratio_clip_eps=0.2, clip_ratio_c=3.0, kl_beta=0.1, entropy_bonus=0.01)
    lp, prox, adv, mask, ref, ent = _random_batch()
    today, today_m = grpo_actor_loss(
        lp, prox, adv, mask, LossConfig(**base), ref_logprobs=ref, entropy=ent, num_tokens=20
    )
    (g_today,) = torch.autograd.grad(today, lp)
    cfg = LossConfig(**base, behaviour_weight=mode)
    got, got_m = grpo_actor_loss(
        lp, prox, adv, mask, cfg, ref_logprobs=ref, entropy=ent, num_tokens=20, behaviour_logprobs=prox.clone()
    )
    (g_got,) = torch.autograd.grad(got, lp)
    assert torch.equal(got, today) and torch.equal(g_got, g_today)
    assert {k: v for k, v in got_m.items() if f"actor/{k}" not in mk.ACTOR_BEHAVIOUR_METRICS} == today_m
    if mode != "none":
        assert got_m["behaviour_weight_mean"] == 1.0 and got_m["behaviour_weight_clip_fraction"] == 0.0
        assert got_m["behaviour_kl"] == 0.0


def test_mode_none_ignores_behaviour_logprobs():
    lp, prox, adv, mask, ref, ent = _random_batch(1)
    behav = prox + torch.randn(prox.shape)  # far off: would change any weighted loss
    cfg = LossConfig(ratio_clip_eps=0.2, kl_beta=0.1, behaviour_weight="none")
    plain = grpo_actor_loss(lp, prox, adv, mask, cfg, ref_logprobs=ref)
    with_behav = grpo_actor_loss(lp, prox, adv, mask, cfg, ref_logprobs=ref, behaviour_logprobs=behav)
    assert torch.equal(plain[0], with_behav[0]) and plain[1] == with_behav[1]
    truncated = grpo_actor_loss(
        lp, prox, adv, mask, _off_policy("truncate", kl_beta=0.1), ref_logprobs=ref, behaviour_logprobs=behav
    )
    assert truncated[0].item() != plain[0].item()


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_weighting_the_loss_equals_weighting_the_advantages(mode):
    """For w >= 0, w * max(-A r, -A clip(r)) (and its dual clip by c) = the same surrogate of the advantage w A."""
    lp, prox, adv, mask, _, _ = _random_batch(2)
    behav = prox + 0.8 * torch.randn(prox.shape, generator=torch.Generator().manual_seed(5))
    w, _ = behaviour_weights(prox, behav, mask, mode, cap=2.0, floor=0.5)
    assert (w[mask.bool()] == 0).any() or mode == "truncate"
    weighted, _ = grpo_actor_loss(
        lp, prox, adv, mask, _off_policy(mode, clip_ratio_c=3.0), num_tokens=15, behaviour_logprobs=behav
    )
    (g1,) = torch.autograd.grad(weighted, lp)
    scaled, _ = grpo_actor_loss(lp, prox, adv * w, mask, _off_policy("none", clip_ratio_c=3.0), num_tokens=15)
    (g2,) = torch.autograd.grad(scaled, lp)
    assert weighted.item() == pytest.approx(scaled.item(), abs=1e-6)
    assert torch.allclose(g1, g2, atol=1e-7)


def test_behaviour_weight_is_finite_and_zero_gradient_off_the_loss_tokens():
    lp, prox, adv, mask, _, _ = _random_batch(3)
    # garbage off the loss tokens (a padded proximal row, an observation's 0.0): no inf * 0 = nan
    prox_in = torch.where(mask.bool(), prox, torch.full_like(prox, float("inf")))
    behav = torch.where(mask.bool(), prox + 0.2, 0.0)
    loss, m = grpo_actor_loss(lp, prox_in, adv, mask, _off_policy("truncate"), behaviour_logprobs=behav)
    loss.backward()
    assert torch.isfinite(loss) and all(math.isfinite(v) for v in m.values())
    assert torch.all(lp.grad[mask == 0] == 0)
    assert m["behaviour_weight_mean"] == pytest.approx(math.exp(-0.2), abs=1e-6)
