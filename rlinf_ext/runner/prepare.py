"""Preparing a run before any worker starts: the config read and validated once, the plan printed, the tiny
offline assets and the retrieval index built when missing, the datasets tokenised; after training, the last
checkpoint converted to Hugging Face. (Nothing is converted before training: the actor reads the HF checkpoint
itself, through the conversion mapping in memory.) Every step that runs a command logs it to ``<run>/logs/`` and fails with a
``LaunchError`` naming the step, the command and the tail of its log.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from rlinf_ext.config import check_config
from rlinf_ext.config.commands import format_plan
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol.agents import agent_spec
from rlinf_ext.retrieval.metadata import METADATA_NAME
from rlinf_ext.runner.checkpoints import latest_complete_checkpoint
from rlinf_ext.runner.errors import LaunchError

if TYPE_CHECKING:
    from rlinf_ext.assets.core.tiny import Parts  # lazy: the asset modules import transformers

REPO_ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- config
def load_checked_config(
    config: str | os.PathLike, overrides: Sequence[str] = (), check_paths: bool = False
) -> ExperimentConfig:
    """Compose and validate a config (a name or a path, ``key=value`` overrides): every problem in one LaunchError."""
    checked = check_config(str(config), list(overrides), check_paths=check_paths)
    if checked.issues or checked.cfg is None:
        lines = "\n".join(f"  - {issue}" for issue in checked.issues)
        raise LaunchError(f"config {config}: {len(checked.issues)} problem(s); nothing was started:\n{lines}")
    for warning in checked.warnings:
        print(f"[launch] warning: {warning}", flush=True)
    return checked.cfg


def print_plan(cfg: ExperimentConfig) -> None:
    """The placement and batch arithmetic, as ``rlinf-ext plan`` prints it."""
    print("=" * 78)
    print(f"[launch] experiment {cfg.runner.experiment_name} -> {run_dir(cfg)}")
    print(format_plan(cfg))
    print("=" * 78, flush=True)


def run_dir(cfg: ExperimentConfig) -> Path:
    return Path(cfg.runner.output_dir) / cfg.runner.experiment_name


def use_launched_server(cfg: ExperimentConfig, address: str) -> None:
    """Point the search tool at the server this run launched; ``retrieval.launch`` goes off so that no
    component downstream starts a second one."""
    cfg.tools.search.server_addr = address
    cfg.retrieval.launch = False


# ---------------------------------------------------------------- tiny assets, index
def prepare_tiny_assets(cfg: ExperimentConfig) -> Path | None:
    """Fill ``paths.tiny_assets`` from the tiny-asset cache if the config uses it (assets/core/cache.py: built
    there first when missing, by the code of this checkout).

    The parts are the agent's (``AgentSpec.tiny_assets``; the base text world for an agent that names none): a
    warm start is copied (and trained, when the cache lacks it) only when the rollout model is it.
    """
    root = cfg.paths.tiny_assets
    if not root:
        return None
    root = Path(root)
    from rlinf_ext.assets.core.cache import cache_dir  # lazy: the asset modules import transformers
    from rlinf_ext.assets.core.tiny import Parts  # lazy: the asset modules import transformers

    cache = cache_dir()
    # the cache folder and where its entries' links point (a cache of links to another cache's entries counts too)
    folders = {cache.resolve()} | {link.resolve().parent for link in cache.glob("*-seed*") if link.is_symlink()}
    if any(root.resolve().is_relative_to(folder) for folder in folders):
        raise LaunchError(
            f"paths.tiny_assets={root} is inside the tiny-asset cache ({cache}), whose entries are shared and stay as "
            "built: a run writes its retrieval index beside the assets, and a launch of other code would replace the "
            "entry with only the parts it needs. Fix: point paths.tiny_assets at a directory of its own (the default, "
            "<repo>/outputs/tiny_assets, or $RLINF_EXT_TINY_ASSETS); the launcher copies the parts there from the cache."
        )
    spec = agent_spec(cfg)
    parts = spec.load("tiny_assets")(cfg) if spec.has("tiny_assets") else Parts.of()
    if made_with_out(root):
        refuse_unfit_out_dir(root, parts)
        print(
            f"[launch] tiny assets: {root} ({parts.describe()}, made by make-tiny-assets --out: used as it is)",
            flush=True,
        )
        return root
    started = time.monotonic()
    if assets_in_place(root, parts):
        print(f"[launch] tiny assets: {root} ({parts.describe()}, in place)", flush=True)
        return root
    print(f"[launch] tiny assets: {root} ({parts.describe()})", flush=True)
    copy_parts_in_child(root, parts)
    print(f"[launch] tiny assets ready in {time.monotonic() - started:.1f} s", flush=True)
    return root


def made_with_out(root: Path) -> bool:
    """Whether ``root`` was made by `make-tiny-assets --out` (the user's own directory, never refilled)."""
    from rlinf_ext.assets.core.tiny import OUT_DIR_MARK, read_manifest  # lazy: the asset modules import transformers

    manifest = read_manifest(root) if root.is_dir() else None
    return bool(manifest and manifest.get(OUT_DIR_MARK))


def refuse_unfit_out_dir(root: Path, parts: Parts, seed: int = 0) -> None:
    """LaunchError unless ``root`` (made with ``--out``) holds ``parts`` for ``seed``, made by this code: the
    launcher never fills such a directory from the cache (nor silently builds the cache instead)."""
    from rlinf_ext.assets.core.cache import cache_key  # lazy: the asset modules import transformers
    from rlinf_ext.assets.core.tiny import Parts, complete_assets, read_manifest  # lazy: as above

    manifest, key = read_manifest(root), cache_key()
    redo = f"rlinf-ext make-tiny-assets --out {root}{parts.flags()}"
    where = f"paths.tiny_assets={root} (made by `make-tiny-assets --out`)"
    elsewhere = "or point paths.tiny_assets at a directory of its own, which the launcher fills from the asset cache."
    if manifest.get("cache_key") != key:
        raise LaunchError(
            f"{where} was made by other code: its MANIFEST.json's cache_key is {manifest.get('cache_key')}, this "
            f"checkout's {key}, so its files may differ from what this code generates and reads. Fix: `{redo}` "
            f"(regenerates it with this code), {elsewhere}"
        )
    if manifest.get("seed") != seed:
        raise LaunchError(
            f"{where} is of seed {manifest.get('seed')}; the launcher's runs use seed {seed}. Fix: "
            f"`{redo} --seed {seed}`, {elsewhere}"
        )
    missing = [
        name
        for name in ("base", *parts.names())
        if complete_assets(root, seed, Parts.of(**({} if name == "base" else {name: True}))) is None
    ]
    if missing:
        raise LaunchError(
            f"{where} lacks {', '.join(missing)} (a part not built, or a file of it gone), which this run needs "
            f"({parts.describe()}). Fix: `{redo}` (adds what is missing), {elsewhere}"
        )


def assets_in_place(root: Path, parts: Parts, seed: int = 0) -> bool:
    """Whether ``root`` already holds ``parts`` (and the base), generated by this code for ``seed``: then nothing
    is copied and no process is spawned (its imports cost ~8 s per launch). Reads only; the key hashes the sources
    in under a second and loads no generator."""
    from rlinf_ext.assets.core.cache import cache_key  # lazy: the asset modules import transformers
    from rlinf_ext.assets.core.tiny import complete_assets, read_manifest  # lazy: the asset modules import transformers

    manifest = read_manifest(root) if root.is_dir() else None
    return (
        bool(manifest)
        and manifest.get("cache_key") == cache_key()
        and manifest.get("seed") == seed
        and complete_assets(root, seed, parts) is not None
    )


def _print_flushed(*args: object) -> None:
    print(*args, flush=True)


def copy_parts_in_child(root: Path, parts: Parts) -> None:
    """``copy_parts`` in a spawned process. Generating assets imports bm25s, which loads numba's llvmlite; beside
    it vLLM cannot start an engine in this process (its CPU platform scans every loaded module and fails on
    llvmlite's ffi object), and the launcher evaluates the trained model on vLLM in this process."""
    from rlinf_ext.assets.core.cache import copy_parts  # lazy: the asset modules import transformers

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(copy_parts, root, parts, 0, _print_flushed).result()


def cli_command(*args: str) -> list[str]:
    """``rlinf-ext ARGS`` run with this interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "rlinf_ext.cli", *args]


def run_step(what: str, command: list[str], log_path: Path) -> None:
    """Run one preparation command (index build, conversion) with its output in ``log_path``.

    A failure becomes a LaunchError that names the step, the command and the tail of its output.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"[launch] {what}: {' '.join(command[3:] if command[:3] == cli_command() else command)}", flush=True)
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
    if code != 0:
        tail = "\n".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise LaunchError(f"{what} failed (exit {code}); full log: {log_path}\n{tail}")
    print(f"[launch] {what}: done in {time.monotonic() - started:.1f} s (log: {log_path})", flush=True)


def index_is_built(index_dir: Path) -> bool:
    """An index counts as built when the builder's metadata file is there (written last, so an interrupted
    build does not count; the builder resumes it)."""
    return (index_dir / METADATA_NAME).is_file()


def ensure_index(cfg: ExperimentConfig) -> None:
    """Build ``retrieval.index_dir`` from ``retrieval.corpus_path`` when the run launches a server and it is missing."""
    r = cfg.retrieval
    if not r.launch or not r.index_dir:
        return
    index_dir = Path(r.index_dir)
    if index_is_built(index_dir):
        print(f"[launch] retrieval index: {index_dir} (already built)", flush=True)
        return
    command = cli_command(
        "build-index", "--corpus", str(r.corpus_path), "--out", str(index_dir), "--retriever", r.retriever
    )
    if r.model_path:
        command += ["--model", str(r.model_path)]
    run_step(f"retrieval index ({r.retriever})", command, run_dir(cfg) / "logs" / "build_index.log")


# ---------------------------------------------------------------- data
def build_datasets(cfg: ExperimentConfig) -> tuple[Any, Any | None]:
    """The agent's train / validation datasets (``AgentSpec.dataset``); over-long prompts are dropped."""
    try:
        train_ds, val_ds = agent_spec(cfg).load("dataset")(cfg)
    except (ValueError, OSError) as exc:
        raise LaunchError(f"data: {exc}") from exc
    print(
        f"[launch] data: {len(train_ds)} training prompts ({getattr(train_ds, 'dropped', 0)} over "
        "data.max_prompt_length dropped)" + (f", {len(val_ds)} validation prompts" if val_ds is not None else ""),
        flush=True,
    )
    return train_ds, val_ds


# ---------------------------------------------------------------- checkpoint conversion
def megatron_checkpoint_exists(path: Path) -> bool:
    return (path / "latest_checkpointed_iteration.txt").is_file()


def checkpoints_root(cfg: ExperimentConfig) -> Path:
    return run_dir(cfg) / "checkpoints"


def convert_last_checkpoint_to_hf(cfg: ExperimentConfig) -> tuple[Path | None, Path | None]:
    """mg2hf on the newest complete ``global_step_N/actor``; returns (checkpoint dir, HF dir).

    The actor saves in Megatron's torch layout (tracker file + ``iter_N/mp_rank_XX/model_optim_rng.pt``),
    so the converter reads the checkpoint directory as is.
    """
    ckpt = latest_complete_checkpoint(checkpoints_root(cfg))
    if ckpt is None:
        print(f"[launch] no complete checkpoint under {checkpoints_root(cfg)}; nothing to convert", flush=True)
        return None, None
    if cfg.actor.training_backend == "fsdp":  # the HF actor's checkpoint is an HF model directory already
        print(f"[launch] HF model: {ckpt / 'actor'} (the fsdp actor saves in HF format; no conversion)", flush=True)
        return ckpt, ckpt / "actor"
    out = run_dir(cfg) / "hf_model" / ckpt.name
    if (out / "config.json").is_file():
        print(f"[launch] Megatron -> HF: {out} (already converted)", flush=True)
        return ckpt, out
    actor_dir = ckpt / "actor"
    if not megatron_checkpoint_exists(actor_dir):
        raise LaunchError(
            f"{actor_dir} is not a Megatron checkpoint (no latest_checkpointed_iteration.txt); it was written by an "
            "older version (actor/model.pt). Train again, or convert it with an older rlinf_ext."
        )
    command = cli_command(
        "convert",
        "mg2hf",
        "--mg",
        str(actor_dir),
        "--out",
        str(out),
        "--hf-template",
        cfg.rollout.model.model_path,
        "--quiet",
    )
    run_step("Megatron -> HF conversion", command, run_dir(cfg) / "logs" / "convert_mg2hf.log")
    return ckpt, out
