"""`make_tiny_assets`: the offline corpus, QA files, tokenizer and models every test and the tiny run use.

Everything is derived from the seed by code in this package, with no network. The output directory holds a
`MANIFEST.json` (seed, generator version, files with their sha256); a later call with the same seed and version
reuses the directory instead of regenerating it. A file lock makes concurrent callers (parallel test sessions)
wait for one generator instead of racing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlinf_ext.assets.core.generate import generate_base
from rlinf_ext.assets.mmsearch.paths import MM_GENERATOR_VERSION, MMAssets, mm_layout
from rlinf_ext.assets.mmsearch.sft import build_mm_sft_model
from rlinf_ext.assets.mmsearch.tiny import generate_mm
from rlinf_ext.assets.searchr1.qa import BENCHMARKS
from rlinf_ext.assets.searchr1.sft import build_sft_model

# Bump when the generated content changes, so that stale cached directories are regenerated.
GENERATOR_VERSION = 7  # 7: qwen2-tiny at head size 32 (2 heads, 1 KV head)
MANIFEST = "MANIFEST.json"


@dataclass(frozen=True)
class TinyAssets:
    """Paths of one generated asset directory (docs/contracts.md, "Data and tiny assets")."""

    root: Path
    seed: int
    corpus_path: Path  # corpus/wiki.jsonl
    pages_path: Path  # corpus/pages.jsonl
    searchr1_train: Path  # data/searchr1/train.parquet
    searchr1_test: dict[str, Path]  # bench -> data/searchr1/test/<bench>.parquet
    rlinf_train: Path  # data/rlinf/train.jsonl
    rlinf_test: dict[str, Path]  # bench -> data/rlinf/test/<bench>.jsonl
    tokenizer_dir: Path
    qwen2_tiny: Path
    qwen2_tiny_untied: Path
    bert_encoder: Path
    qwen2_tiny_sft: Path | None = None  # only with with_sft=True: the warm start (searches or gives up)
    # only with with_sft=True: the same SFT before its give-up pass (always searches; sft.SFTConfig)
    qwen2_tiny_sft_search: Path | None = None
    benchmarks: tuple[str, ...] = field(default=BENCHMARKS)
    mm: MMAssets | None = None  # only with with_mm=True: the multimodal world (assets/mmsearch/tiny.py)

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST


def _layout(root: Path, seed: int, with_sft: bool, with_mm: bool = False) -> TinyAssets:
    return TinyAssets(
        mm=mm_layout(root) if with_mm else None,
        root=root,
        seed=seed,
        corpus_path=root / "corpus" / "wiki.jsonl",
        pages_path=root / "corpus" / "pages.jsonl",
        searchr1_train=root / "data" / "searchr1" / "train.parquet",
        searchr1_test={b: root / "data" / "searchr1" / "test" / f"{b}.parquet" for b in BENCHMARKS},
        rlinf_train=root / "data" / "rlinf" / "train.jsonl",
        rlinf_test={b: root / "data" / "rlinf" / "test" / f"{b}.jsonl" for b in BENCHMARKS},
        tokenizer_dir=root / "tokenizer",
        qwen2_tiny=root / "models" / "qwen2-tiny",
        qwen2_tiny_untied=root / "models" / "qwen2-tiny-untied",
        bert_encoder=root / "models" / "bert-tiny-encoder",
        qwen2_tiny_sft=(root / "models" / "qwen2-tiny-sft") if with_sft else None,
        qwen2_tiny_sft_search=(root / "models" / "qwen2-tiny-sft-search") if with_sft else None,
    )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in (MANIFEST, ".lock")}


def read_manifest(root: Path) -> dict | None:
    path = Path(root) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def _reusable(manifest: dict | None, root: Path, seed: int, with_sft: bool, with_mm: bool = False,
              with_mm_sft: bool = False) -> bool:
    if not manifest or manifest.get("seed") != seed or manifest.get("version") != GENERATOR_VERSION:
        return False
    if with_sft and not manifest.get("with_sft"):
        return False
    if (with_mm or with_mm_sft) and manifest.get("mm_version") != MM_GENERATOR_VERSION:
        return False
    if with_mm_sft and not manifest.get("with_mm_sft"):
        return False
    with_mm = with_mm or with_mm_sft
    # the multimodal world is checked only when asked for: a damaged mm/ does not force the base to rebuild
    return all((root / rel).is_file() for rel in manifest.get("files", {}) if with_mm or not rel.startswith("mm/"))


def make_tiny_assets(out_dir, seed: int = 0, with_sft: bool = False, verbose: bool = False,
                     with_mm: bool = False, with_mm_sft: bool = False) -> TinyAssets:
    """Generate (or reuse) the tiny assets under `out_dir`; see the module docstring and docs/contracts.md,
    "Data and tiny assets".

    Parts already present for this seed and generator version are kept: asking for `with_mm` on a directory
    that has the warm start only adds the multimodal world, and the other way round."""
    root = Path(out_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    log = print if verbose else (lambda *a, **k: None)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        manifest = read_manifest(root)
        with_mm = with_mm or with_mm_sft
        if _reusable(manifest, root, seed, with_sft, with_mm, with_mm_sft):
            log(f"reusing {root} (seed {seed}, version {GENERATOR_VERSION})")
            return _layout(root, seed, with_sft or bool(manifest.get("with_sft")),
                           with_mm or manifest.get("mm_version") == MM_GENERATOR_VERSION)
        base_ok = _reusable(manifest, root, seed, with_sft=False)
        sft_ok = base_ok and _reusable(manifest, root, seed, with_sft=True)
        mm_ok = base_ok and _reusable(manifest, root, seed, with_sft=False, with_mm=True)
        mm_sft_ok = mm_ok and _reusable(manifest, root, seed, with_sft=False, with_mm_sft=True)
        if manifest is not None and not base_ok:
            log(f"{root}: MANIFEST is for seed {manifest.get('seed')} / version {manifest.get('version')}; regenerating")
        timings: dict[str, float] = dict(manifest.get("timings_s", {})) if base_ok else {}
        if not base_ok:
            (root / MANIFEST).unlink(missing_ok=True)  # an interrupted run must not look complete
            timings.update(generate_base(root, seed, log))
        # adding a part keeps the old MANIFEST until the new one is written: it does not claim the part yet, so an
        # interrupted addition is redone without regenerating what was already complete
        with_sft, with_mm, with_mm_sft = with_sft or sft_ok, with_mm or mm_ok, with_mm_sft or mm_sft_ok
        assets = _layout(root, seed, with_sft, with_mm)
        if with_sft and not sft_ok:
            t0 = time.perf_counter()
            build_sft_model(assets, seed, log)
            timings["sft"] = round(time.perf_counter() - t0, 2)
        if with_mm and not mm_ok:
            timings.update(generate_mm(root, seed, log))
        if with_mm_sft and not mm_sft_ok:
            t0 = time.perf_counter()
            build_mm_sft_model(root, seed, log)
            timings["mm_sft"] = round(time.perf_counter() - t0, 2)
        new_manifest = {"seed": seed, "version": GENERATOR_VERSION, "with_sft": with_sft,
                        "timings_s": timings, "files": _file_hashes(root)}
        if with_mm:
            new_manifest.update(mm_version=MM_GENERATOR_VERSION, with_mm_sft=with_mm_sft)
        (root / MANIFEST).write_text(json.dumps(new_manifest, indent=1, sort_keys=True) + "\n")
        return assets
