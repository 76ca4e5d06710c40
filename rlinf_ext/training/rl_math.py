"""GRPO math as pure tensor functions (no model, no device logic).

Advantages, the clipped loss and the KL estimator are ``rlinf.algorithms``' (CPU and GPU train RLinf's formulas);
this module adapts shapes, adds the token mean that stays exact under gradient accumulation (denominator: the loss
tokens of the whole mini-batch) and decoupled PPO's behaviour weights: each token's clipped surrogate (anchored at
the step's recompute, ``old_logprobs``) is weighted by the detached ``pi_prox / pi_behav`` (the engine's log-probs),
truncated at a cap or masked outside [floor, cap] (``behaviour_weights``). ``[B, T]`` tensors are aligned on
predicted tokens (column t: token t+1, ``batching.py``); ``loss_mask`` is 1 only on policy-generated tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from rlinf.algorithms.losses import compute_ppo_actor_loss
from rlinf.algorithms.registry import calculate_adv_and_returns
from rlinf.algorithms.utils import kl_penalty

from rlinf_ext.protocol import metric_keys as mk

SUPPORTED_ADV_TYPES = ("grpo", "grpo_dynamic")
BehaviourWeight = Literal["truncate", "mask", "none"]
BEHAVIOUR_WEIGHT_MODES = ("truncate", "mask", "none")


def compute_advantages(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_size: int,
    adv_type: str = "grpo",
    advantage_mode: str = "trajectory",
    idx_to_traj: list[int] | None = None,
) -> torch.Tensor:
    """Per-token GRPO advantages ``[B, T]`` (zero where ``loss_mask`` is 0).

    ``rewards`` is ``[B]`` with the ``group_size`` samples of one prompt contiguous. ``grpo_dynamic``
    (one row per turn) needs ``idx_to_traj``; with one row per trajectory it defaults to ``range(B)``.
    """
    if adv_type not in SUPPORTED_ADV_TYPES:
        raise ValueError(f"algorithm.adv_type={adv_type!r} is not supported here; use one of {SUPPORTED_ADV_TYPES}.")
    if rewards.ndim != 1 or rewards.shape[0] != loss_mask.shape[0]:
        raise ValueError(
            f"rewards must be [B] matching loss_mask [B, T]; got {tuple(rewards.shape)} and {tuple(loss_mask.shape)}."
        )
    if group_size < 2 or rewards.shape[0] % group_size:
        raise ValueError(
            f"GRPO needs group_size >= 2 dividing the batch; got group_size={group_size}, batch={rewards.shape[0]}."
        )
    kwargs = dict(
        task_type="reasoning",
        adv_type=adv_type,
        rewards=rewards.float(),
        loss_mask=loss_mask.float(),
        group_size=group_size,
    )
    if adv_type == "grpo_dynamic":
        kwargs.update(
            num_sequence=rewards.shape[0],
            idx_to_traj=list(range(rewards.shape[0])) if idx_to_traj is None else list(idx_to_traj),
            advantage_mode=advantage_mode,
        )
    advantages, _ = calculate_adv_and_returns(**kwargs)
    return advantages.float() * loss_mask.float()


def token_mean(values: torch.Tensor, mask: torch.Tensor, num_tokens: float | None = None) -> torch.Tensor:
    """Sum of ``values`` over ``mask`` divided by ``num_tokens`` (default: ``mask.sum()``, at least 1).

    Passing the mini-batch token count as ``num_tokens`` makes the sum of micro-batch losses equal the
    token mean over the whole mini-batch. Masked entries are multiplied by 0, so they get zero gradient.
    """
    denom = float(mask.sum().item()) if num_tokens is None else float(num_tokens)
    return (values * mask.to(values.dtype)).sum() / max(denom, 1.0)


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): ``exp(ref-lp) - (ref-lp) - 1`` (clamped, from RLinf)."""
    return kl_penalty(logprobs, ref_logprobs, "low_var_kl")


@dataclass(frozen=True)
class LossConfig:
    """The algorithm knobs of the actor loss (names follow ``algorithm.*``)."""

    ratio_clip_eps: float = 0.2
    clip_ratio_c: float | None = None
    kl_beta: float = 0.0
    entropy_bonus: float = 0.0
    # algorithm.off_policy: the behaviour weight of decoupled PPO (applies only when behaviour log-probs are given)
    behaviour_weight: BehaviourWeight = "truncate"
    behaviour_weight_cap: float = 2.0
    behaviour_weight_floor: float = 0.5


def behaviour_weights(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: BehaviourWeight,
    cap: float,
    floor: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token weight ``w = exp(prox - behav)`` of decoupled PPO, detached, 0 off the loss tokens, and its metrics.

    ``truncate``: ``min(w, cap)``; ``mask``: ``w`` inside ``[floor, cap]``, else 0; ``none``: 1. Metrics over the
    loss tokens: mean applied weight, fraction truncated or masked, and KL(behav || prox) by k3 (``w - 1 - log w``,
    >= 0, low variance since the tokens are the behaviour policy's samples).
    """
    if mode not in BEHAVIOUR_WEIGHT_MODES:
        raise ValueError(f"algorithm.off_policy.behaviour_weight={mode!r}; use one of {BEHAVIOUR_WEIGHT_MODES}.")
    mask = loss_mask.bool()
    prox, behav = proximal_logprobs.detach().float(), behaviour_logprobs.detach().float()
    raw = torch.exp(prox - behav)  # off the loss tokens anything (inf, nan): replaced by 0 below
    if mode == "truncate":
        clipped = raw > cap
        w = torch.clamp(raw, max=cap)
    elif mode == "mask":
        clipped = (raw < floor) | (raw > cap)
        w = torch.where(clipped, 0.0, raw)
    else:
        clipped = torch.zeros_like(mask)
        w = torch.ones_like(raw)
    w = torch.where(mask, w, 0.0)
    count = max(int(mask.sum().item()), 1)
    kl = torch.where(mask, low_var_kl(behav, prox), 0.0)
    metrics = {
        mk.actor_name(mk.ACTOR_BEHAVIOUR_WEIGHT_MEAN): float(w.sum() / count),
        mk.actor_name(mk.ACTOR_BEHAVIOUR_WEIGHT_CLIP_FRACTION): float((clipped & mask).sum() / count),
        mk.actor_name(mk.ACTOR_BEHAVIOUR_KL): float(kl.sum() / count),
    }
    return w, metrics


def grpo_actor_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: LossConfig,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_tokens: float | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy loss (+ ``kl_beta`` * low_var_kl, - ``entropy_bonus`` * entropy), token-mean.

    Returns the loss and float metrics; ``num_tokens``: the mini-batch's loss-token count (``token_mean``). With
    ``behaviour_logprobs`` and ``cfg.behaviour_weight`` not ``none``, each clipped surrogate (not the KL or entropy
    term) is weighted by ``behaviour_weights`` (decoupled PPO); without them, bit for bit the plain clipped loss.
    """
    mask = loss_mask.bool()
    denom = float(mask.sum().item()) if num_tokens is None else float(num_tokens)
    weight, weight_metrics = None, {}
    if behaviour_logprobs is not None and cfg.behaviour_weight != "none":
        weight, weight_metrics = behaviour_weights(
            old_logprobs,
            behaviour_logprobs,
            mask,
            cfg.behaviour_weight,
            cfg.behaviour_weight_cap,
            cfg.behaviour_weight_floor,
        )

    # RLinf's surrogate, weighted where it is aggregated, as its compute_decoupled_ppo_actor_loss does (for w >= 0
    # the same as scaling the advantages by w, dual clip included), so the clip metrics stay those of pi / pi_prox.
    # That function itself is not called: it masks above a threshold only (no truncation, no floor) and logs other
    # ratio metrics (proximal_ratio, no policy_loss_abs), so switching the weight on or off would rename metrics.
    def agg(values, m, _ratio=None):
        return token_mean(values if weight is None else values * weight, m, denom)

    pg_loss, pg_metrics = compute_ppo_actor_loss(
        logprobs=logprobs.float(),
        old_logprobs=old_logprobs.float(),
        advantages=advantages.float(),
        clip_ratio_low=cfg.ratio_clip_eps,
        clip_ratio_high=cfg.ratio_clip_eps,
        clip_ratio_c=cfg.clip_ratio_c,
        loss_mask=mask,
        loss_agg_func=agg,
    )
    loss = pg_loss
    metrics = {mk.actor_name(k): float(v) for k, v in pg_metrics.items()}
    metrics.update(weight_metrics)
    if cfg.kl_beta > 0:
        if ref_logprobs is None:
            raise ValueError(
                "algorithm.kl_beta > 0 needs reference logprobs (recompute them with the frozen reference)."
            )
        # The where() keeps masked positions out of the graph entirely (no 0 * inf = nan).
        kl = torch.where(mask, low_var_kl(logprobs.float(), ref_logprobs.float()), 0.0)
        kl_loss = token_mean(kl, mask, denom)
        loss = loss + cfg.kl_beta * kl_loss
        metrics["kl"] = float(kl_loss.detach())
    if cfg.entropy_bonus > 0:
        if entropy is None:
            raise ValueError("algorithm.entropy_bonus > 0 needs per-token entropy.")
        ent = token_mean(torch.where(mask, entropy.float(), 0.0), mask, denom)
        loss = loss - cfg.entropy_bonus * ent
        metrics["entropy"] = float(ent.detach())
    metrics["loss"] = float(loss.detach())
    return loss, metrics
