"""Learning-rate schedule: linear warmup then constant / linear / cosine decay (Megatron's shapes)."""

from __future__ import annotations

import math

DECAY_STYLES = ("constant", "linear", "cosine")


def lr_at(step: int, total_steps: int, lr: float, warmup_fraction: float, decay_style: str, min_lr: float) -> float:
    """LR of optimizer step ``step`` (0-based) out of ``total_steps``.

    Warmup lasts ``round(warmup_fraction * total_steps)`` steps and rises linearly to ``lr`` (step 0 uses
    ``lr / warmup``, never 0, so the first update is not wasted); decay then runs to ``min_lr`` at the
    last step.
    """
    if decay_style not in DECAY_STYLES:
        raise ValueError(f"actor.lr_sched.lr_decay_style={decay_style!r}; use one of {DECAY_STYLES}.")
    if not 0.0 <= warmup_fraction < 1.0:
        raise ValueError(f"actor.lr_sched.lr_warmup_fraction={warmup_fraction} must be in [0, 1).")
    total_steps = max(int(total_steps), 1)
    warmup = int(round(warmup_fraction * total_steps))
    if step < warmup:
        return lr * (step + 1) / warmup
    if decay_style == "constant":
        return lr
    span = max(total_steps - 1 - warmup, 1)
    progress = min(max((step - warmup) / span, 0.0), 1.0)
    if decay_style == "linear":
        return min_lr + (lr - min_lr) * (1.0 - progress)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
