"""Atomic checkpoint directories: write into a temp dir, add a manifest marker, then rename.

A checkpoint ``<root>/global_step_N`` (RLinf layout: ``actor/``, ``data/``) counts as complete only if it
holds ``COMPLETE.json`` and every file the marker lists exists with the recorded size. A crash mid-write
leaves only a ``.tmp-*`` directory (never picked); a directory truncated afterwards fails the size check
and is skipped with a warning.

The actor's part is Megatron's legacy (non-distributed) torch layout, so mg2hf (ours and RLinf's) and
Megatron-LM read it as is::

    actor/latest_checkpointed_iteration.txt      "N"
    actor/iter_{N:07d}/mp_rank_00/model_optim_rng.pt
        {"model", "checkpoint_version": 3.0, "iteration": N,          # what the converters read
         "optimizer", "opt_param_scheduler", "rng_state", "rlinf_ext"} # what resume reads
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Mapping

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

MARKER = "COMPLETE.json"
_STEP_RE = re.compile(r"^global_step_(\d+)$")


def staging_dir(root: str | Path, step: int) -> Path:
    """A fresh temp directory next to the final ``global_step_{step}`` (same filesystem -> atomic rename)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-global_step_{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def _file_sizes(directory: Path) -> dict[str, int]:
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MARKER
    }


def _fsync_files(directory: Path) -> None:
    """Flush every file to disk before the marker claims it is complete (a power loss after the rename
    must not leave a "complete" checkpoint with empty files)."""
    for p in directory.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def finalize(tmp: Path, step: int, extra: dict | None = None) -> Path:
    """Write the marker (file manifest) into ``tmp`` and rename it to ``global_step_{step}``."""
    tmp = Path(tmp)
    _fsync_files(tmp)
    marker = {"step": step, "files": _file_sizes(tmp), **(extra or {})}
    with open(tmp / MARKER, "w") as f:
        json.dump(marker, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    final = tmp.parent / f"global_step_{step}"
    if final.exists():  # re-saving a step (e.g. after a resume) replaces the old copy
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def check_complete(ckpt_dir: str | Path) -> str | None:
    """None if ``ckpt_dir`` is a complete checkpoint, else the reason it is not."""
    ckpt_dir = Path(ckpt_dir)
    marker = ckpt_dir / MARKER
    if not marker.is_file():
        return f"no {MARKER} marker (interrupted while writing?)"
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError) as exc:
        return f"unreadable {MARKER}: {exc}"
    for rel, size in files.items():
        path = ckpt_dir / rel
        if not path.is_file():
            return f"missing file {rel}"
        if path.stat().st_size != size:
            return f"file {rel} has {path.stat().st_size} bytes, expected {size} (truncated)"
    return None


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``global_step_N`` directory under ``root``, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_RE.match(p.name))]
    return sorted(found, reverse=True)


def latest_complete_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``; incomplete ones are skipped with a warning."""
    for step, path in list_checkpoints(root):
        reason = check_complete(path)
        if reason is None:
            return path
        warnings.warn(f"Skipping checkpoint {path}: {reason}.", RuntimeWarning, stacklevel=2)
    return None


def step_of(ckpt_dir: str | Path) -> int:
    m = _STEP_RE.match(Path(ckpt_dir).name)
    if not m:
        raise ValueError(f"{ckpt_dir} is not a checkpoint directory (expected a name like global_step_12).")
    return int(m.group(1))


# ---------------------------------------------------------------- the actor's files (Megatron legacy layout)

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


def load_actor_checkpoint(actor_dir: str | Path) -> dict[str, Any]:
    """The whole rank file of an actor checkpoint (``global_step_N/actor``, or its ``iter_*`` folder)."""
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
    path = layout.rank_file(0, 0)
    try:  # our own file: numpy / python RNG states need the full unpickler
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(f"{path}: cannot be read as a torch checkpoint ({type(exc).__name__}: {exc}); "
                         "it is truncated or corrupt, resume from another global_step_N") from exc
    missing = [k for k in ("model", "iteration", *ACTOR_TRAINING_KEYS) if k not in ckpt]
    if missing:
        raise ValueError(f"{path}: no {missing} entries; a weights-only Megatron checkpoint (e.g. from hf2mg) "
                         "cannot resume training; point runner.resume_dir at a global_step_N the trainer saved")
    return ckpt
