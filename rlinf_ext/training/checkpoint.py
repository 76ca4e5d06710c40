"""The actor's checkpoint files, in Megatron's legacy (non-distributed) torch layout, and RNG capture/restore.

mg2hf (ours and RLinf's) and Megatron-LM read the layout as is::

    actor/latest_checkpointed_iteration.txt      "N"
    actor/iter_{N:07d}/mp_rank_00/model_optim_rng.pt
        {"model", "checkpoint_version": 3.0, "iteration": N,          # what the converters read
         "optimizer", "opt_param_scheduler", "rng_state", "rlinf_ext"} # what resume reads
    actor/iter_{N:07d}/mp_rank_00/distrib_optim.pt   # CUDA distributed optimizer only (Megatron-LM's name)

The run directory around it (``global_step_N``, the completion marker, atomic renames) is
``runner/checkpoints.py``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from rlinf_ext.convert.mapping import ConversionError
from rlinf_ext.convert.mg_checkpoint import (
    RANK_FILE,
    TRACKER_FILE,
    discover_ranks,
    iteration_dir_name,
    rank_dir_name,
    resolve_iteration_dir,
    save_rank_file,
    write_tracker,
)

ACTOR_FORMAT = "megatron-legacy-tp1pp1"
# Entries resume needs besides "model" (Megatron-LM's key names; see the module docstring).
ACTOR_TRAINING_KEYS = ("optimizer", "opt_param_scheduler", "rng_state")


def actor_rank_file(actor_dir: str | Path, iteration: int) -> Path:
    """``actor_dir/iter_{N:07d}/mp_rank_00/model_optim_rng.pt`` (the actor runs TP=PP=1 per process)."""
    return Path(actor_dir) / iteration_dir_name(iteration) / rank_dir_name(0, 0, 1) / RANK_FILE


def save_actor_checkpoint(
    actor_dir: str | Path,
    iteration: int,
    model: Mapping[str, torch.Tensor],
    *,
    optimizer: Mapping[str, Any],
    opt_param_scheduler: Mapping[str, Any],
    rng_state: list[dict[str, Any]],
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Write one actor checkpoint as Megatron does: model, optimizer, scheduler and RNG in one rank file,
    then the tracker file naming its iteration. Returns the rank file."""
    if int(iteration) < 1:  # Megatron-LM refuses iter_0000000; the trainer saves after step >= 1
        raise ValueError(f"actor checkpoint iteration must be >= 1 (the rollout step), got {iteration}")
    actor_dir = Path(actor_dir)
    path = actor_rank_file(actor_dir, int(iteration))
    extra = {
        "optimizer": dict(optimizer),
        "opt_param_scheduler": dict(opt_param_scheduler),
        "rng_state": list(rng_state),
        "rlinf_ext": {"format": ACTOR_FORMAT, "tp": 1, "pp": 1, **dict(meta or {})},
    }
    save_rank_file(path, model, int(iteration), extra=extra)
    write_tracker(actor_dir, int(iteration))  # last: the tracker only ever names a fully written file
    return path


def locate_actor_rank_file(actor_dir: str | Path) -> Path:
    """The rank file of an actor checkpoint (``global_step_N/actor``, or its ``iter_*`` folder); files the
    optimizer writes beside it (``distrib_optim.pt``) live in the same folder."""
    actor_dir = Path(actor_dir)
    if (actor_dir / "model.pt").is_file() and not (actor_dir / TRACKER_FILE).is_file():
        raise FileNotFoundError(
            f"{actor_dir}: an actor checkpoint in the old layout (model.pt + optim.pt + rng.pt); this version reads "
            f"Megatron's layout ({TRACKER_FILE} + iter_N/mp_rank_00/{RANK_FILE}). Resume from a newer checkpoint "
            "or start the run again."
        )
    try:
        layout = discover_ranks(resolve_iteration_dir(actor_dir))
    except ConversionError as exc:
        raise FileNotFoundError(f"not an actor checkpoint written by save_checkpoint: {exc}") from exc
    if (layout.tp, layout.pp) != (1, 1):
        raise ValueError(
            f"{layout.iter_dir}: checkpoint is TP={layout.tp}, PP={layout.pp}; the actor resumes TP=PP=1 checkpoints "
            "only (convert with `rlinf-ext convert mg2hf` then `hf2mg --tp 1 --pp 1`)"
        )
    return layout.rank_file(0, 0)


def load_actor_checkpoint(actor_dir: str | Path) -> dict[str, Any]:
    """The whole rank file of an actor checkpoint (``global_step_N/actor``, or its ``iter_*`` folder)."""
    path = locate_actor_rank_file(actor_dir)
    try:  # our own file: numpy / python RNG states need the full unpickler
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(
            f"{path}: cannot be read as a torch checkpoint ({type(exc).__name__}: {exc}); "
            "it is truncated or corrupt, resume from another global_step_N"
        ) from exc
    missing = [k for k in ("model", "iteration", *ACTOR_TRAINING_KEYS) if k not in ckpt]
    if missing:
        raise ValueError(
            f"{path}: no {missing} entries; a weights-only Megatron checkpoint (e.g. from hf2mg) "
            "cannot resume training; point runner.resume_dir at a global_step_N the trainer saved"
        )
    return ckpt


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states under Megatron-LM's ``rng_state`` entry names (python, numpy, torch, CUDA)."""
    state = {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda_rng_state"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if "cuda_rng_state" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng_state"])
