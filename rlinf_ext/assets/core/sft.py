"""The one supervised warm-start loop, shared by the Search-R1 and the MMSearch-R1 warm starts.

Both train on trajectories the real agent loop produced (`assets/core/playback.py`): the prompt and the environment's
observations carry no loss, the model's own (mask-1) tokens do, with a per-token weight (the Search-R1 warm
start weights tokens copied out of an observation up). Every step draws one batch from each `Stream` (e.g.
search trajectories plus short give-up ones, each padded only to its own batch's length) and takes one
weighted token mean over all of them; AdamW (no decay on norms and biases), linear warm-up then cosine to
lr/10, gradient clipping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch


@dataclass(frozen=True)
class SFTExample:
    """One training row: the prompt (no loss), then the response with a loss weight per token."""

    prompt_ids: list[int]
    response_ids: list[int]
    weights: list[float]  # per response token: 0 on what the environment inserted, > 0 on the model's own tokens
    images: tuple = ()  # vision-language rows: every image of the row, in order of appearance

    @classmethod
    def from_trajectory(cls, trajectory: Any, weights: list[float] | None = None) -> "SFTExample":
        """A loop's trajectory (`prompt_ids`, `response_ids`, `response_mask`, optional `images`); weight 1 on
        mask-1 tokens unless `weights` says otherwise."""
        weights = [float(m) for m in trajectory.response_mask] if weights is None else list(weights)
        if len(weights) != len(trajectory.response_ids):
            raise ValueError(f"{len(weights)} weights for {len(trajectory.response_ids)} response ids")
        if any(w and not m for w, m in zip(weights, trajectory.response_mask)):
            raise ValueError("a loss weight on a token the model did not generate (response_mask 0)")
        return cls(
            list(trajectory.prompt_ids),
            list(trajectory.response_ids),
            weights,
            tuple(getattr(trajectory, "images", ()) or ()),
        )

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def loss_weights(self) -> list[float]:
        return [0.0] * len(self.prompt_ids) + self.weights


@dataclass(frozen=True)
class Stream:
    """`batch_size` examples per step, drawn epoch by epoch (shuffled with its own `seed`)."""

    examples: list[SFTExample]
    batch_size: int
    seed: int


class LoopSettings(Protocol):
    """What `train` reads from a warm start's config (the Search-R1, MMSearch-R1 and registry ones)."""

    steps: int
    lr: float
    warmup_steps: int
    schedule: str  # "cosine" (to lr/10 at `steps`) or "constant" (a phase that a gate ends, not the schedule)
    weight_decay: float
    clip_grad: float
    threads: int


SCHEDULES = ("cosine", "constant")


def lr_at(step: int, cfg: LoopSettings) -> float:
    """Linear warm-up to `cfg.lr` over `warmup_steps`, then cosine to lr/10 at `steps` (or constant)."""
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {cfg.schedule!r}")
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def weighted_lm_loss(logits: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, weighted per target token: sum(w * ce) / sum(w)."""
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none")
    w = weights[:, 1:].flatten()
    return (ce * w).sum() / w.sum().clamp_min(1e-8)


def weighted_target_loss(model, inputs: dict, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`weighted_lm_loss` with the LM head applied only where a target has weight: the base model's hidden
    states (``model.model``), then ``model.lm_head`` on the positions that predict a weighted token. The same
    value; far cheaper when most positions are prompt or observation (a large vocabulary, a small model)."""
    hidden = model.model(**inputs).last_hidden_state[:, :-1]
    w = weights[:, 1:]
    keep = w > 0
    ce = torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]).float(), ids[:, 1:][keep], reduction="none")
    return (ce * w[keep]).sum() / w[keep].sum().clamp_min(1e-8)


def collate(examples: list[SFTExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and per-token loss weights (0 on the prompt, the observations, the padding)."""
    n = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), n), dtype=torch.long)
    weights = torch.zeros((len(examples), n), dtype=torch.float32)
    for i, e in enumerate(examples):
        L = len(e.input_ids)
        ids[i, :L] = torch.tensor(e.input_ids)
        attn[i, :L] = 1
        weights[i, :L] = torch.tensor(e.loss_weights, dtype=torch.float32)
    return ids, attn, weights


@dataclass
class _Sampler:
    """Epochs of a shuffled index list, drawn ``size`` at a time."""

    n: int
    gen: torch.Generator
    order: list[int] = field(default_factory=list)

    def take(self, size: int) -> list[int]:
        while len(self.order) < size:
            self.order += torch.randperm(self.n, generator=self.gen).tolist()
        picked, self.order = self.order[:size], self.order[size:]
        return picked


def train(
    model,
    streams: list[Stream],
    cfg: LoopSettings,
    pad_id: int,
    *,
    vision_inputs: Callable[[torch.Tensor, list], dict[str, torch.Tensor]] | None = None,
    progress: bool = True,
    desc: str = "warm-start SFT",
    logits_on_targets: bool = False,
    check: Callable[[int], bool] | None = None,
    check_every: int = 0,
) -> list[float]:
    """`cfg.steps` optimizer steps on one batch of every (non-empty) stream each; returns every step's loss.

    `vision_inputs(input_ids, images)` -> the extra model inputs of a batch (pixel values, grid sizes, modality ids), for
    vision-language models; the model gets `input_ids`, `attention_mask` and those, and its logits are scored here.
    `logits_on_targets`: score through `weighted_target_loss` (the LM head on weighted positions only).
    `check(steps_done)`, called every `check_every` steps (in eval mode, without gradients): True ends the phase
    there (a gate met); the returned losses then stop at that step.
    """
    from tqdm import tqdm

    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        active = [s for s in streams if s.examples and s.batch_size > 0]
        samplers = [_Sampler(len(s.examples), torch.Generator().manual_seed(s.seed)) for s in active]
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
            betas=(0.9, 0.98),
        )
        model.train()
        losses: list[float] = []
        bar = tqdm(range(cfg.steps), desc=desc, disable=not progress)
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            # one weighted token mean over every stream's batch: sum(w * ce) / sum(w)
            total, weight_sum = 0.0, 0.0
            for stream, sampler in zip(active, samplers):
                batch = [stream.examples[i] for i in sampler.take(stream.batch_size)]
                ids, attn, weights = collate(batch, pad_id)
                images = [img for e in batch for img in e.images]
                extra = vision_inputs(ids, images) if vision_inputs and images else {}  # a text-only batch: none
                inputs = {"input_ids": ids, "attention_mask": attn, **extra}
                part = (
                    weighted_target_loss(model, inputs, ids, weights)
                    if logits_on_targets
                    else weighted_lm_loss(model(**inputs).logits, ids, weights)
                )
                total = total + part * weights[:, 1:].sum()
                weight_sum += float(weights[:, 1:].sum())
            loss = total / max(weight_sum, 1e-8)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            opt.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if check is not None and check_every > 0 and (step + 1) % check_every == 0:
                model.eval()
                with torch.no_grad():
                    done = check(step + 1)
                model.train()
                if done:
                    break
        model.eval()
        return losses
    finally:
        torch.set_num_threads(threads_before)
