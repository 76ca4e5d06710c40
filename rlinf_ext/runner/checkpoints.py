"""Atomic checkpoint directories of a run: write into a temp dir, add a manifest marker, then rename.

A checkpoint ``<run>/checkpoints/global_step_N`` (RLinf layout: ``actor/``, ``data/``) counts as complete only if
it holds ``COMPLETE.json`` and every file the marker lists exists with the recorded size. A crash mid-write leaves
only a ``.tmp-*`` directory (never picked); a directory truncated afterwards fails the size check and is skipped
with a warning. What the actor writes inside ``actor/`` is ``training/checkpoint.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path

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
