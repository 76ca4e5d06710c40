"""The tiny-asset cache: one generated asset directory per (code, pins, seed), built once and copied from.

Generating the tiny assets and training their warm starts takes minutes; the tests and the tiny experiments
take a copy of a cached directory instead. An entry is keyed by a hash of what produces its bytes:

- the source of every `rlinf_ext` module that `assets/core/tiny.py` imports, directly or not (found from the
  import statements, lazy ones included), and every file under `rlinf_ext/assets/` (chat templates);
- the installed version of every distribution those modules import (torch, transformers, tokenizers, ...), and
  the Python version.

An edit to that code or an upgrade gives a new key, so an entry is never reused across such a change (entries of
older keys are left on disk; delete the cache directory to reclaim them). Entries are only ever created whole:
parts are generated in a temporary directory beside them and published by renaming it and then swapping the
entry's symlink to it, both atomic, under a file lock (parallel sessions wait for one builder).

Where: ``$RLINF_EXT_ASSET_CACHE``, else ``$XDG_CACHE_HOME/rlinf_ext/tiny_assets``, else
``~/.cache/rlinf_ext/tiny_assets`` (docs/environment.md). ``rlinf-ext make-tiny-assets`` (no ``--out``) fills it
and prints the entry's path.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

from rlinf_ext.assets.core.lock import HOLDER_SUFFIX, held_lock
from rlinf_ext.assets.core.tiny import (
    MANIFEST,
    Parts,
    TinyAssets,
    complete_assets,
    make_tiny_assets,
    part_of_file,
    read_manifest,
)

CACHE_ENV = "RLINF_EXT_ASSET_CACHE"
PACKAGE = "rlinf_ext"
ROOT_MODULE = "rlinf_ext.assets.core.tiny"
# old versions of an entry are removed once this old (a reader that resolved one copies it in seconds)
STALE_VERSION_S = 3600.0


def cache_dir() -> Path:
    """Where entries live (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "rlinf_ext" / "tiny_assets"


def _package_dir() -> Path:
    return Path(__file__).resolve().parents[2]  # rlinf_ext/


def _module_file(name: str) -> Path | None:
    rel = Path(*name.split(".")[1:])
    pkg = _package_dir()
    for cand in (pkg / rel / "__init__.py", (pkg / rel).with_suffix(".py")):
        if cand.is_file():
            return cand
    return None


def _imports(path: Path) -> set[str]:
    """Absolute module names imported anywhere in the file (function bodies too); for `from a import b` both
    `a` and `a.b` (b may be a submodule)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def source_closure(root_module: str = ROOT_MODULE) -> tuple[list[Path], set[str]]:
    """(the package's source files reachable from ``root_module`` by imports, with their packages' __init__
    files; the top-level names of the other modules they import)."""
    seen: dict[str, Path] = {}
    external: set[str] = set()
    todo = [root_module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue  # `from pkg import function`: the name is no module
        seen[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]  # parent packages run their __init__
        for imp in _imports(path):
            if imp.split(".")[0] == PACKAGE:
                todo.append(imp)
            else:
                external.add(imp.split(".")[0])
    return sorted(set(seen.values())), external


# used underneath torch/transformers to compute or write the bytes, imported by no module of the closure
UNDERLYING_DISTRIBUTIONS = ("numpy", "safetensors", "huggingface-hub", "jinja2")


def _distribution_versions(top_level: set[str]) -> dict[str, str]:
    dists = importlib.metadata.packages_distributions()
    names = {dist for name in top_level for dist in dists.get(name, ())} | set(UNDERLYING_DISTRIBUTIONS)
    out = {}
    for dist in sorted(names):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def key_inputs() -> dict:
    """What the key hashes: source files (path -> sha256), distribution versions, Python."""
    pkg = _package_dir()
    files, external = source_closure()
    assets_dir = pkg / "assets"
    files = sorted(
        set(files)
        | {
            p
            for p in assets_dir.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc",)
        }
    )
    return {
        "files": {str(p.relative_to(pkg.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files},
        "distributions": _distribution_versions(external),
        "python": f"{platform.python_implementation()} {sys.version_info[0]}.{sys.version_info[1]}",
    }


def cache_key() -> str:
    return hashlib.sha256(json.dumps(key_inputs(), sort_keys=True).encode()).hexdigest()[:24]


def entry_path(seed: int = 0, key: str | None = None) -> Path:
    """The entry's symlink (to the newest complete version directory)."""
    return cache_dir() / f"{key or cache_key()}-seed{seed}"


def cached_tiny_assets(parts: Parts, seed: int = 0, log: Callable[..., None] = print) -> TinyAssets:
    """The cache entry for this code and ``seed`` holding at least ``parts``: reused, or completed (the missing
    parts generated into a copy that then replaces the entry atomically). Never write into what this returns."""
    link = entry_path(seed)
    link.parent.mkdir(parents=True, exist_ok=True)
    current = link.resolve() if link.is_symlink() else None
    found = complete_assets(current, seed, parts) if current else None
    if found:
        return found
    with held_lock(link.parent / f"{link.name}.lock", f"{parts.describe()} (seed {seed}) for {link.name}"):
        current = link.resolve() if link.is_symlink() else None
        found = complete_assets(current, seed, parts) if current else None
        if found:
            return found
        have = Parts.of_manifest(read_manifest(current)) if current else Parts()
        tmp = link.parent / f".tmp-{link.name}-{uuid.uuid4().hex[:8]}"
        try:
            if current:
                shutil.copytree(current, tmp, ignore=shutil.ignore_patterns(".lock", ".lock" + HOLDER_SUFFIX))
            log(f"[assets] building {parts.union(have).describe()} (seed {seed}) for cache entry {link}")
            make_tiny_assets(tmp, seed=seed, parts=parts.union(have), verbose=True)
            (tmp / ".lock").unlink(missing_ok=True)
            (tmp / (".lock" + HOLDER_SUFFIX)).unlink(missing_ok=True)
            _write_manifest(tmp, {**read_manifest(tmp), "cache_key": link.name.rsplit("-seed", 1)[0]})
            version = link.parent / f"{link.name}.{uuid.uuid4().hex[:8]}"
            os.rename(tmp, version)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        tmp_link = link.parent / f".link-{uuid.uuid4().hex[:8]}"
        os.symlink(version.name, tmp_link)
        os.replace(tmp_link, link)
        _remove_old_versions(link, keep=version)
        return complete_assets(version, seed, parts)


def _remove_old_versions(link: Path, keep: Path) -> None:
    now = time.time()
    for old in link.parent.glob(f"{link.name}.*"):
        if old != keep and old.is_dir() and now - old.stat().st_mtime > STALE_VERSION_S:
            shutil.rmtree(old, ignore_errors=True)


def _write_manifest(root: Path, manifest: dict) -> None:
    """Written beside and renamed over: a reader never sees half a MANIFEST (the mark of a complete directory)."""
    tmp = root / f".{MANIFEST}.{uuid.uuid4().hex[:8]}"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, root / MANIFEST)


def copy_parts(root: Path, parts: Parts, seed: int = 0, log: Callable[..., None] = print) -> TinyAssets:
    """``root`` made to hold exactly the parts it held plus ``parts``, copied from the cache (filled first if
    needed): what the tests and the tiny experiments run on (they write beside the assets, e.g. an index).

    A ``root`` generated by this code gets the missing parts' files and then its new MANIFEST (so an interrupted
    copy claims nothing new); one of other code or seed (or none) is replaced whole, with what it held beside the
    assets (an index of an older corpus), by a copy written beside it and renamed into place."""
    root = Path(root).resolve()
    old = read_manifest(root) if root.is_dir() else None
    key = cache_key()
    same_code = bool(old) and old.get("cache_key") == key and old.get("seed") == seed
    have = Parts.of_manifest(old) if same_code else Parts()
    want = parts.union(have)
    if same_code and (found := complete_assets(root, seed, want)) is not None:
        return found
    entry = cached_tiny_assets(want, seed, log).root
    manifest = read_manifest(entry)
    files = {rel: h for rel, h in manifest["files"].items() if want.has(part_of_file(rel))}
    claims = set(Parts.of(sft_search=True, registry=True, mm_sft=True).manifest_fields())  # replaced by the copy's
    claims |= set() if want.registry else {"registry"}  # a warm start's checks go with its files
    claims |= set() if want.mm_sft else {"mm_sft"}
    new_manifest = {**{k: v for k, v in manifest.items() if k not in claims}, **want.manifest_fields(), "files": files}
    if same_code:
        for rel in files:
            if not (root / rel).is_file():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                part = root / f"{rel}.{uuid.uuid4().hex[:8]}.part"
                shutil.copy2(entry / rel, part)
                os.replace(part, root / rel)
        _write_manifest(root, new_manifest)
    else:
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = root.parent / f".tmp-{root.name}-{uuid.uuid4().hex[:8]}"
        aside = root.parent / f".old-{root.name}-{uuid.uuid4().hex[:8]}"
        try:
            for rel in files:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(entry / rel, tmp / rel)
            _write_manifest(tmp, new_manifest)
            if root.exists():
                os.rename(root, aside)
            os.rename(tmp, root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(aside, ignore_errors=True)
    log(f"[assets] {root}: {want.describe()} copied from the cache entry {entry}")
    return complete_assets(root, seed, want)
