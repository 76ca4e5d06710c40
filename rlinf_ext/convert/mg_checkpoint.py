"""Megatron torch-format checkpoints on disk: find them, read them lazily, write them.

Layout (what Megatron-LM and RLinf save and load)::

    DIR/latest_checkpointed_iteration.txt        "release" or an iteration number N > 0
    DIR/release/ or DIR/iter_{N:07d}/
        mp_rank_{tp:02d}/model_optim_rng.pt              (PP = 1)
        mp_rank_{tp:02d}_{pp:03d}/model_optim_rng.pt     (PP > 1)

``model_optim_rng.pt`` is a pickled dict ``{"model": state_dict, "checkpoint_version": 3.0,
"iteration": N, ...}`` (training adds "optimizer", "rng_state", "args", ...).
"""

from __future__ import annotations

import ctypes
import mmap
import pickle
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from rlinf_ext.convert.mapping import ConversionError

TRACKER_FILE = "latest_checkpointed_iteration.txt"
RANK_FILE = "model_optim_rng.pt"
CHECKPOINT_VERSION = 3.0
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")
_ITER_DIR = re.compile(r"^iter_(\d{7})$")


def iteration_dir_name(iteration: int | None) -> str:
    """``release`` for None, else ``iter_{N:07d}``."""
    return "release" if iteration is None else f"iter_{iteration:07d}"


def rank_dir_name(tp_rank: int, pp_rank: int, pp: int) -> str:
    return f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def _has_rank_dirs(path: Path) -> bool:
    return any(_RANK_DIR.match(p.name) for p in path.iterdir() if p.is_dir())


def resolve_iteration_dir(path: str | Path) -> Path:
    """The folder holding the ``mp_rank_*`` folders, from any of the forms users pass.

    Accepts the iteration folder itself, a folder with ``latest_checkpointed_iteration.txt``
    (RLinf's ``global_step_N/actor``), or a folder with exactly one ``iter_*``/``release`` folder.
    """
    root = Path(path)
    if not root.is_dir():
        raise ConversionError(f"{root}: not a directory (pass global_step_N/actor, or its iter_XXXXXXX folder)")
    if _has_rank_dirs(root):
        return root
    tracker = root / TRACKER_FILE
    if tracker.is_file():
        text = tracker.read_text().strip()
        if text == "release":
            chosen = root / "release"
        elif text.isdigit():
            chosen = root / iteration_dir_name(int(text))
        else:
            raise ConversionError(f"{tracker}: expected 'release' or an iteration number, found {text!r}")
        if not chosen.is_dir():
            raise ConversionError(f"{tracker} names {chosen.name}, but {chosen} does not exist")
        if not _has_rank_dirs(chosen):
            raise ConversionError(f"{chosen}: no mp_rank_* folders in the iteration folder")
        return chosen
    candidates = sorted(p for p in root.iterdir() if p.is_dir() and (_ITER_DIR.match(p.name) or p.name == "release"))
    if len(candidates) == 1 and _has_rank_dirs(candidates[0]):
        return candidates[0]
    if len(candidates) > 1:
        raise ConversionError(
            f"{root}: several iterations ({', '.join(p.name for p in candidates)}) and no {TRACKER_FILE}; "
            "pass the iteration folder you want"
        )
    raise ConversionError(
        f"{root}: not a Megatron checkpoint (no mp_rank_* folders, no {TRACKER_FILE}, no iter_* folder)"
    )


@dataclass(frozen=True)
class RankLayout:
    """The TP×PP grid found in an iteration folder (``pp_named``: folders carry the ``_YYY`` suffix)."""

    iter_dir: Path
    tp: int
    pp: int
    pp_named: bool = False

    def rank_file(self, tp_rank: int, pp_rank: int) -> Path:
        name = f"mp_rank_{tp_rank:02d}_{pp_rank:03d}" if self.pp_named else f"mp_rank_{tp_rank:02d}"
        return self.iter_dir / name / RANK_FILE


def discover_ranks(iter_dir: Path) -> RankLayout:
    """Find TP and PP from the ``mp_rank_*`` folders; every rank file of the grid must exist."""
    found: set[tuple[int, int]] = set()
    suffixes: set[bool] = set()
    for p in iter_dir.iterdir():
        if p.name.startswith("mp_rank_for_expert"):
            raise ConversionError(f"{p}: expert-parallel checkpoints are not supported (dense Qwen2 only)")
        m = _RANK_DIR.match(p.name)
        if not m or not p.is_dir():
            continue
        suffixes.add(m.group(2) is not None)
        found.add((int(m.group(1)), int(m.group(2) or 0)))
    if not found:
        raise ConversionError(f"{iter_dir}: no mp_rank_* folders")
    if len(suffixes) > 1:
        raise ConversionError(f"{iter_dir}: mixes mp_rank_XX and mp_rank_XX_YYY folders; remove the stale ones")
    layout = RankLayout(
        iter_dir, tp=max(t for t, _ in found) + 1, pp=max(p for _, p in found) + 1, pp_named=suffixes.pop()
    )
    missing = [
        str(layout.rank_file(t, p))
        for p in range(layout.pp)
        for t in range(layout.tp)
        if not layout.rank_file(t, p).is_file()
    ]
    if missing:
        raise ConversionError(
            f"{iter_dir}: incomplete TP={layout.tp} PP={layout.pp} checkpoint, missing rank files: {missing}"
        )
    return layout


# --------------------------------------------------------------------------- safe-ish unpickling


class _Placeholder:
    """Stands in for classes a training checkpoint pickles but conversion never needs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return _Placeholder


class _PickleModule:
    """``pickle_module`` for ``torch.load``: unknown classes (args, rng states) become placeholders."""

    Unpickler = _Unpickler
    load = staticmethod(lambda f, **kw: _Unpickler(f, **kw).load())


def load_rank_file(path: Path) -> dict[str, Any]:
    """Open one ``model_optim_rng.pt`` memory-mapped; returns its ``model`` state dict (lazy pages)."""
    if not Path(path).is_file():
        raise ConversionError(f"{path}: rank file does not exist")
    try:
        if zipfile.is_zipfile(path):
            ckpt = torch.load(path, map_location="cpu", mmap=True, weights_only=False, pickle_module=_PickleModule)
        else:  # legacy (pre-zip) torch.save format cannot be memory-mapped
            ckpt = torch.load(path, map_location="cpu", weights_only=False, pickle_module=_PickleModule)
    except Exception as e:  # corrupt / truncated / not a torch file
        raise ConversionError(f"{path}: cannot be read as a torch checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(ckpt, Mapping):
        raise ConversionError(f"{path}: expected a dict with a 'model' entry, found {type(ckpt).__name__}")
    if "model" not in ckpt:
        if any(k.startswith("model") and k[5:].isdigit() for k in ckpt):
            raise ConversionError(f"{path}: virtual-pipeline checkpoints (model0, model1, ...) are not supported")
        raise ConversionError(f"{path}: no 'model' entry (keys: {sorted(map(str, ckpt))})")
    return ckpt["model"]


_RESERVED_KEYS = ("model", "checkpoint_version", "iteration")


def save_rank_file(
    path: Path, state: Mapping[str, Any], iteration: int | None, extra: Mapping[str, Any] | None = None
) -> None:
    """Write one rank in the key layout RLinf's converter and Megatron-LM use.

    ``extra`` adds the training entries Megatron keeps in the same file (``optimizer``, ``rng_state``,
    ``opt_param_scheduler``, ...); converters read only ``model``.
    """
    clash = sorted(set(extra or {}) & set(_RESERVED_KEYS))
    if clash:
        raise ValueError(f"save_rank_file: extra may not set {clash}; pass the model state and iteration as arguments")
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": dict(state),
        "checkpoint_version": CHECKPOINT_VERSION,
        "iteration": 0 if iteration is None else iteration,
        **dict(extra or {}),
    }
    torch.save(payload, path)


def write_tracker(root: Path, iteration: int | None) -> None:
    (root / TRACKER_FILE).write_text("release" if iteration is None else str(iteration))


# --------------------------------------------------------------------------- page release


_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4
_MADV_POPULATE_READ = 22  # Linux >= 5.14
_libc = None


def _madvise(tensor: torch.Tensor, advice: int, inner: bool) -> bool:
    global _libc
    if not sys.platform.startswith("linux") or tensor.numel() == 0:
        return False
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        if inner:  # only pages lying fully inside this tensor
            first, last = -(-start // _PAGE) * _PAGE, (end // _PAGE) * _PAGE
        else:
            first, last = (start // _PAGE) * _PAGE, -(-end // _PAGE) * _PAGE
        if last <= first:
            return False
        return _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), advice) == 0
    except Exception:
        return False


def prefetch_pages(tensor: torch.Tensor) -> None:
    """Map a memory-mapped tensor's pages in one call (``MADV_POPULATE_READ``) instead of one page
    fault per 4 KiB when it is first read — the dominant cost of reading a mmap'd checkpoint."""
    _madvise(tensor, _MADV_POPULATE_READ, inner=False)


def release_pages(tensor: torch.Tensor) -> None:
    """Drop the resident pages of a memory-mapped, never-written tensor (Linux ``madvise``).

    ``torch.load(mmap=True)`` maps the file privately; pages we only read are clean, so dropping
    them is safe (a later read re-faults them from the file) and keeps RSS near one layer instead of
    the whole checkpoint. Only for tensors from `load_rank_file`: on ordinary memory it would zero them.
    """
    _madvise(tensor, _MADV_DONTNEED, inner=True)
