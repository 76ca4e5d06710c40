"""Saving and restoring a ``MegatronPolicy``: weights, optimizer, LR-schedule position and RNG, in Megatron's
legacy layout (``training/checkpoint.py``), on every data-parallel rank.

Every rank calls ``save_policy`` (the RNG states and, with ZeRO or the distributed optimizer, the optimizer
state are gathered collectively); data-parallel rank 0 writes. Every rank calls ``load_policy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from rlinf_ext.models.megatron import load_megatron_state_dict
from rlinf_ext.training.checkpoint import (
    actor_rank_file,
    capture_rng_state,
    load_actor_checkpoint,
    locate_actor_rank_file,
    restore_rng_state,
    save_actor_checkpoint,
)
from rlinf_ext.training.data_parallel import DataParallel
from rlinf_ext.training.settings import ActorSettings


class MegatronPolicy(Protocol):
    """What this module reads of ``training/megatron_policy.py:MegatronPolicy`` (which imports this module)."""

    settings: ActorSettings
    dp: DataParallel
    model: torch.nn.Module
    step: Any  # training/optimizer.py: TorchStep | MegatronStep
    optimizer_steps: int
    hf_model_path: str

    def megatron_state_dict(self) -> dict[str, torch.Tensor]: ...


def scheduler_state(policy: MegatronPolicy) -> dict[str, Any]:
    """The LR schedule position (Megatron's ``opt_param_scheduler`` entry; steps = optimizer steps)."""
    s = policy.settings
    total = s.total_train_steps * s.n_minibatches
    return {
        "num_steps": policy.optimizer_steps,
        "max_lr": s.lr,
        "min_lr": s.min_lr,
        "lr_warmup_steps": round(s.lr_warmup_fraction * total),
        "lr_decay_steps": total,
        "lr_decay_style": s.lr_decay_style,
    }


def save_policy(policy: MegatronPolicy, directory: str | Path, iteration: int) -> Path | None:
    """Write ``directory/iter_N/mp_rank_00/model_optim_rng.pt`` (+ ``distrib_optim.pt`` for the CUDA distributed
    optimizer) and the tracker; returns the rank file on rank 0, None elsewhere."""
    rng_states = policy.dp.gather_objects(capture_rng_state())  # one per data-parallel rank, as Megatron
    optimizer = policy.step.state_dict()  # collective with ZeRO
    rank_dir = actor_rank_file(directory, int(iteration)).parent
    if policy.dp.rank == 0:
        rank_dir.mkdir(parents=True, exist_ok=True)
    policy.step.save_extra(rank_dir)  # collective; written by rank 0 before the tracker names the iteration
    if policy.dp.rank != 0:
        return None
    return save_actor_checkpoint(
        directory,
        iteration,
        policy.megatron_state_dict(),  # the weights are the same on every rank
        optimizer=optimizer,
        opt_param_scheduler=scheduler_state(policy),
        rng_state=rng_states,
        meta={"hf_model_path": policy.hf_model_path},
    )


def load_policy(policy: MegatronPolicy, directory: str | Path) -> int:
    """Restore weights, optimizer, LR-schedule position and RNG; returns the checkpoint's iteration."""
    ckpt = load_actor_checkpoint(directory)
    load_megatron_state_dict(policy.model, ckpt["model"], source=f"{directory} (iteration {ckpt['iteration']})")
    policy.step.load_state_dict(ckpt["optimizer"], directory=locate_actor_rank_file(directory).parent)
    policy.optimizer_steps = int(ckpt["opt_param_scheduler"]["num_steps"])
    # this rank's RNG state; a checkpoint from fewer ranks gives its first one (Megatron's fallback)
    rng = ckpt["rng_state"]
    restore_rng_state(rng[policy.dp.rank] if policy.dp.rank < len(rng) else rng[0])
    return int(ckpt["iteration"])
