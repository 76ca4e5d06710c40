"""Hand-computed checks of PPO's critic math: GAE over a two-turn response with an observation span in the middle,
the reward on the last generated token, whitening, and the clipped value loss with its metrics."""

import math

import pytest
import torch

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.training.ppo_math import (
    explained_variance,
    gae_advantages,
    last_token_rewards,
    masked_gae,
    value_loss,
    whiten,
)

# response: turn 1 (2 generated tokens), observation (2 tokens), turn 2 (2 generated tokens), padding (1)
MASK = torch.tensor([[1, 1, 0, 0, 1, 1, 0]], dtype=torch.float32)
VALUES = torch.tensor([[0.5, 0.25, 9.0, 9.0, 0.75, 0.5, 7.0]])  # 9 and 7: what the critic says off the mask


def test_reward_sits_on_the_last_generated_token():
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    r = last_token_rewards(torch.tensor([1.0, 0.5, 3.0]), mask)
    assert r.tolist() == [[0, 0, 0, 1, 0, 0], [0.5, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]


def test_gae_with_gamma_lambda_one_is_reward_minus_value_on_every_generated_token():
    rewards = last_token_rewards(torch.tensor([1.0]), MASK)
    adv, ret = masked_gae(rewards, VALUES, MASK, gamma=1.0, lam=1.0)
    # A_t = R - V_t (the TD errors telescope); observation and padding: 0, whatever the critic said there
    assert adv.tolist() == [[0.5, 0.75, 0.0, 0.0, 0.25, 0.5, 0.0]]
    assert ret.tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]]


def test_gae_skips_the_observation_span():
    rewards = last_token_rewards(torch.tensor([1.0]), MASK)
    g, lam = 0.5, 0.5
    adv, ret = masked_gae(rewards, VALUES, MASK, gamma=g, lam=lam)
    # by hand, generated tokens t0, t1, t4, t5 in that order (the observation t2, t3 costs no discount step):
    d5 = 1.0 + g * 0.0 - 0.5  # last generated token: reward, no next value
    a5 = d5  # 0.5
    d4 = 0.0 + g * 0.5 - 0.75  # next generated value is V5
    a4 = d4 + g * lam * a5  # -0.5 + 0.125
    d1 = 0.0 + g * 0.75 - 0.25  # across the observation: V4, not the 9.0 on the observation
    a1 = d1 + g * lam * a4
    d0 = 0.0 + g * 0.25 - 0.5
    a0 = d0 + g * lam * a1
    expected = [a0, a1, 0.0, 0.0, a4, a5, 0.0]
    assert adv[0].tolist() == pytest.approx(expected)
    assert ret[0].tolist() == pytest.approx([a0 + 0.5, a1 + 0.25, 0.0, 0.0, a4 + 0.75, a5 + 0.5, 0.0])


def test_whiten_over_the_mask_only():
    x = torch.tensor([[1.0, 3.0, 100.0], [5.0, -50.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.float32)
    out = whiten(x, mask)
    # picked 1, 3, 5, 7: mean 4, unbiased variance 20/3
    s = math.sqrt(20 / 3)
    assert out.flatten().tolist() == pytest.approx([-3 / s, -1 / s, 0.0, 1 / s, 0.0, 3 / s], abs=1e-6)


def test_gae_advantages_are_whitened_and_returns_are_not():
    mask = torch.cat([MASK, torch.tensor([[1, 1, 1, 0, 0, 0, 0]], dtype=torch.float32)])
    values = torch.cat([VALUES, torch.zeros(1, 7)])
    adv, ret = gae_advantages(torch.tensor([1.0, 0.0]), values, mask)
    raw = torch.tensor([0.5, 0.75, 0.25, 0.5, 0.0, 0.0, 0.0])  # row 0's generated tokens, then row 1's (R=0, V=0)
    expected = (raw - raw.mean()) / raw.std()
    picked = adv[mask.bool()]
    assert picked.tolist() == pytest.approx(expected.tolist(), abs=1e-6)
    assert ret[0].tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert ret[1].tolist() == [0.0] * 7


def test_value_loss_clips_around_the_old_values():
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.float32)
    old = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    new = torch.tensor([[0.5, 0.1, 5.0, 1.0]], requires_grad=True)
    returns = torch.tensor([[1.0, -1.0, 3.0, 0.0]])
    loss, metrics = value_loss(new, old, returns, mask, value_clip=0.2)
    # token 0: plain (0.5-1)^2 = .25, clipped (0.2-1)^2 = .64 -> .64 (clipped term larger)
    # token 1: plain (0.1+1)^2 = 1.21, clipped the same (inside the clip) -> 1.21
    # token 3: plain (1-0)^2 = 1, clipped the same -> 1; token 2 is masked out
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1.21 + 1.0) / 3)
    assert metrics[mk.CRITIC_VALUE_LOSS] == pytest.approx(loss.item())
    assert metrics[mk.CRITIC_VALUE_CLIP_FRAC] == pytest.approx(1 / 3)
    assert metrics[mk.CRITIC_VALUES_MEAN] == pytest.approx((0.5 + 0.1 + 1.0) / 3)
    loss.backward()
    # token 0 takes the clipped branch: V_clip does not move with V there, so its gradient is 0; masked token 2: 0
    assert new.grad[0].tolist() == pytest.approx([0.0, (0.1 + 1.0) / 3, 0.0, 1.0 / 3])
    # a mini-batch denominator keeps micro-batch losses additive
    half, _ = value_loss(new.detach(), old, returns, mask, value_clip=0.2, num_tokens=6)
    assert half.item() == pytest.approx(loss.item() / 2)


def test_explained_variance():
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.float32)
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)
    assert math.isnan(explained_variance(returns, torch.ones_like(returns), mask))  # constant returns


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="one shape"):
        masked_gae(torch.zeros(1, 3), torch.zeros(1, 4), torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"\[B\]"):
        last_token_rewards(torch.zeros(2, 1), torch.ones(2, 3))
