"""PPO-with-a-critic math as pure tensor functions: GAE over masked multi-turn responses and the clipped value loss.

``[B, R]`` tensors are per response token (``batching.response_slice``); ``mask`` is the ``response_mask`` (1 on
generated tokens, 0 on tool output and padding). The value of token j estimates the return before j is generated.
GAE runs over generated tokens only: an observation has no value, reward or TD error and carries the next value and
the running advantage across unchanged (as verl's multi-turn ``compute_gae_advantage_return``), so a tool reply costs
no discount step. Search-R1 (verl 0.1) runs over every token; at its gamma = lambda = 1 both give ``A_t = R - V_t``.
Advantages are whitened over the loss tokens (as verl's GAE); returns are the raw ``advantages + values``."""

from __future__ import annotations

import torch

from rlinf_ext.protocol import metric_keys as mk


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` token-level rewards: each trajectory's scalar reward ``[B]`` on its last generated token, 0
    elsewhere (a trajectory without a generated token gets none)."""
    if rewards.ndim != 1 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(
            f"rewards must be [B] matching mask [B, R]; got {tuple(rewards.shape)} and {tuple(mask.shape)}."
        )
    out = torch.zeros(mask.shape, dtype=torch.float32)
    m = mask.bool()
    cols = torch.arange(mask.shape[1]).expand_as(m)
    last = torch.where(m, cols, -1).max(dim=1).values  # -1: no generated token
    rows = (last >= 0).nonzero().flatten()
    out[rows, last[rows]] = rewards[rows].float()
    return out


def masked_gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) ``[B, R]`` of GAE over the generated tokens only (0 off the mask).

    For generated tokens t < t' consecutive among the generated ones: ``delta_t = r_t + gamma * V_t' - V_t`` (V after
    the last generated token = 0, the episode ends) and ``A_t = delta_t + gamma * lam * A_t'``; observation tokens
    are skipped (module docstring). ``returns = A + V`` on the mask."""
    if not (token_rewards.shape == values.shape == mask.shape):
        raise ValueError(
            f"token_rewards, values and mask must have one shape; got {tuple(token_rewards.shape)}, "
            f"{tuple(values.shape)}, {tuple(mask.shape)}."
        )
    m = mask.float()
    v = values.float() * m
    r = token_rewards.float() * m
    adv = torch.zeros_like(v)
    next_value = torch.zeros(v.shape[0])
    running = torch.zeros(v.shape[0])
    for t in reversed(range(v.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        candidate = delta + gamma * lam * running
        # on an observation (or padding) token nothing moves: the next generated token's value and advantage carry over
        running = torch.where(m[:, t] > 0, candidate, running)
        next_value = torch.where(m[:, t] > 0, v[:, t], next_value)
        adv[:, t] = running * m[:, t]
    return adv, (adv + v) * m


def masked_moments(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """(count, sum, sum of squares) of ``values`` over the mask: what data-parallel ranks add up before ``whiten``."""
    picked = values[mask.bool()].double()
    return float(picked.numel()), float(picked.sum()), float((picked * picked).sum())


def whiten(
    values: torch.Tensor, mask: torch.Tensor, moments: tuple[float, float, float] | None = None, eps: float = 1e-8
) -> torch.Tensor:
    """``values`` shifted and scaled to mean 0, variance 1 over the mask (0 off it); unbiased variance, as verl.
    ``moments`` (``masked_moments`` summed over the ranks) makes it the whole step's statistics."""
    moments = masked_moments(values, mask) if moments is None else moments
    var = _variance(moments)
    if var is None:
        return torch.zeros_like(values, dtype=torch.float32)
    out = (values.float() - moments[1] / moments[0]) / (var + eps) ** 0.5
    return torch.where(mask.bool(), out, 0.0)


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's (whitened advantages, returns) ``[B, R]`` from scalar rewards ``[B]`` and the critic's values."""
    adv, returns = masked_gae(last_token_rewards(rewards, mask), values, mask, gamma, lam)
    return whiten(adv, mask), returns


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss ``0.5 * max((V - G)^2, (V_clip - G)^2)``, ``V_clip = V_old + clamp(V - V_old, +-value_clip)``,
    summed over the mask and divided by ``num_tokens`` (default: the mask's count; the mini-batch's loss-token
    count keeps micro-batch losses additive, as ``rl_math.token_mean``). Metrics (``critic/...`` names) over the mask:
    the loss, the share of tokens where the clipped term is the larger (verl's clip fraction), the mean value and
    the explained variance ``1 - Var(G - V) / Var(G)`` (NaN when the returns do not vary)."""
    m = mask.bool()
    denom = float(m.sum().item()) if num_tokens is None else float(num_tokens)
    v, old, g = values.float(), old_values.float(), returns.float()
    clipped = old + (v - old).clamp(-value_clip, value_clip)
    plain_sq, clipped_sq = (v - g) ** 2, (clipped - g) ** 2
    per_token = 0.5 * torch.maximum(plain_sq, clipped_sq)
    loss = torch.where(m, per_token, 0.0).sum() / max(denom, 1.0)
    count = max(int(m.sum().item()), 1)
    metrics = {
        mk.CRITIC_VALUE_LOSS: float(loss.detach()),
        mk.CRITIC_VALUE_CLIP_FRAC: float(((clipped_sq > plain_sq) & m).sum()) / count,
        mk.CRITIC_VALUES_MEAN: float(torch.where(m, v.detach(), 0.0).sum()) / count,
        mk.CRITIC_VF_EXPLAINED_VAR: explained_variance(v.detach(), g, m),
    }
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(G - V) / Var(G)`` over the mask: 1 = the critic predicts the returns, 0 = no better than their
    mean; NaN with fewer than two tokens or constant returns (nothing to explain)."""
    g = returns.float()
    return explained_variance_of(masked_moments(g, mask), masked_moments(g - values.float(), mask))


def explained_variance_of(
    return_moments: tuple[float, float, float], residual_moments: tuple[float, float, float]
) -> float:
    """``explained_variance`` from the ``masked_moments`` of the returns and of ``returns - values`` (summed over
    data-parallel ranks: the whole step's)."""
    var_g, var_d = _variance(return_moments), _variance(residual_moments)
    if var_g is None or var_d is None or var_g <= 0.0:
        return float("nan")
    return 1.0 - var_d / var_g


def _variance(moments: tuple[float, float, float]) -> float | None:
    count, total, squares = moments
    if count < 2:
        return None
    return max(squares - total * total / count, 0.0) / (count - 1)


def add_moments(parts) -> tuple[float, float, float]:
    """The element-wise sum of ``masked_moments`` triples (of samples, of ranks)."""
    count = total = squares = 0.0
    for c, t, q in parts:
        count, total, squares = count + c, total + t, squares + q
    return count, total, squares
