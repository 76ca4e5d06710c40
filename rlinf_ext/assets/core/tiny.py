"""`make_tiny_assets`: the offline corpus, QA files, tokenizer and models every test and the tiny run use.

Everything is derived from the seed by code in this package, with no network. The output directory holds a
`MANIFEST.json` (seed, generator version, files with their sha256); a later call with the same seed and version
reuses the directory instead of regenerating it. A file lock makes concurrent callers (parallel test sessions)
wait for one generator instead of racing. The tests and the tiny experiments do not call this on their own
directories: they copy from the cache of generated directories (`assets/core/cache.py`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path

from rlinf_ext.assets.core.generate import generate_base
from rlinf_ext.assets.core.lock import HOLDER_SUFFIX, held_lock
from rlinf_ext.assets.mmsearch.paths import MM_GENERATOR_VERSION, Assets, layout
from rlinf_ext.assets.mmsearch.sft import build_mm_sft_model
from rlinf_ext.assets.mmsearch.sft import manifest_entry as mm_sft_manifest_entry
from rlinf_ext.assets.mmsearch.tiny import generate_mm
from rlinf_ext.assets.registry.generate import RegistryPaths, generate_registry, manifest_entry, registry_paths
from rlinf_ext.assets.searchr1.qa import BENCHMARKS
from rlinf_ext.assets.searchr1.sft import build_sft_search_model

# Bump when the generated content changes, so that stale cached directories are regenerated.
GENERATOR_VERSION = 8  # 8: the registry world replaces the give-up warm start
MANIFEST = "MANIFEST.json"
# a MANIFEST field: the directory was made by `make-tiny-assets --out`, so the launcher uses it as it is
OUT_DIR_MARK = "made_by_out"


@dataclass(frozen=True)
class Parts:
    """The optional parts of an asset directory beyond the base (corpus, QA, tokenizer, random models).

    ``sft_search``: the base world's warm start (`models/qwen2-tiny-sft-search`, always searches; what the
    end-to-end tests start from); ``registry``: the registry world and its reader warm start (`registry/`, the tiny
    experiment's world, `assets/registry/`); ``mm``: the multimodal world (`mm/`); ``mm_sft``: the VL warm start
    (`mm/models/qwen2.5-vl-tiny-sft`, implies mm). Use `Parts.of` (it adds the implied parts)."""

    sft_search: bool = False
    registry: bool = False
    mm: bool = False
    mm_sft: bool = False

    @staticmethod
    def of(sft_search: bool = False, registry: bool = False, mm: bool = False, mm_sft: bool = False) -> "Parts":
        return Parts(sft_search=sft_search, registry=registry, mm=mm or mm_sft, mm_sft=mm_sft)

    @staticmethod
    def of_manifest(manifest: dict | None) -> "Parts":
        """The parts a MANIFEST.json claims."""
        if not manifest:
            return Parts()
        mm = manifest.get("mm_version") == MM_GENERATOR_VERSION
        return Parts.of(
            sft_search=bool(manifest.get("with_sft_search")),
            registry=bool(manifest.get("with_registry")),
            mm=mm,
            mm_sft=mm and bool(manifest.get("with_mm_sft")),
        )

    def union(self, other: "Parts") -> "Parts":
        return Parts.of(*(a or b for a, b in zip(astuple(self), astuple(other))))

    def covers(self, other: "Parts") -> bool:
        return all(a or not b for a, b in zip(astuple(self), astuple(other)))

    def has(self, part: str) -> bool:
        """``part``: "base" (always) or a field name (`part_of_file`)."""
        return part == "base" or getattr(self, part)

    def describe(self) -> str:
        return "base" + "".join(f" + {name}" for name in self.names())

    def names(self) -> list[str]:
        """The fields set, beyond the base."""
        return [f.name for f in fields(self) if getattr(self, f.name)]

    def flags(self) -> str:
        """The `make-tiny-assets` options that build these parts (" --with-registry", ...)."""
        return "".join(f" --with-{name.replace('_', '-')}" for name in self.names())

    def manifest_fields(self) -> dict:
        out = {"with_sft_search": self.sft_search, "with_registry": self.registry}
        if self.mm:
            out.update(mm_version=MM_GENERATOR_VERSION, with_mm_sft=self.mm_sft)
        return out


SFT_SEARCH_DIR = "models/qwen2-tiny-sft-search/"
REGISTRY_DIR = "registry/"
MM_SFT_DIR = "mm/models/qwen2.5-vl-tiny-sft/"


def part_of_file(rel: str) -> str:
    """The part (a `Parts` field, or "base") a file of an asset directory belongs to, by its relative path."""
    for prefix, part in (
        (SFT_SEARCH_DIR, "sft_search"),
        (REGISTRY_DIR, "registry"),
        (MM_SFT_DIR, "mm_sft"),
        ("mm/", "mm"),
    ):
        if rel.startswith(prefix):
            return part
    return "base"


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
    # only with the sft_search part: the base world's warm start (always searches; searchr1/sft.SFTConfig)
    qwen2_tiny_sft_search: Path | None = None
    registry: RegistryPaths | None = None  # only with the registry part: the tiny experiment's world
    benchmarks: tuple[str, ...] = field(default=BENCHMARKS)
    mm: Assets | None = None  # only with the mm part: the multimodal world (assets/mmsearch/tiny.py)

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST


def _layout(root: Path, seed: int, parts: Parts) -> TinyAssets:
    return TinyAssets(
        mm=layout(root) if parts.mm else None,
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
        qwen2_tiny_sft_search=(root / SFT_SEARCH_DIR) if parts.sft_search else None,
        registry=registry_paths(root) if parts.registry else None,
    )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in (MANIFEST, ".lock", ".lock" + HOLDER_SUFFIX)
    }


def read_manifest(root: Path) -> dict | None:
    path = Path(root) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def _valid_parts(manifest: dict | None, root: Path, seed: int) -> Parts | None:
    """The parts of ``root`` its MANIFEST claims and whose files are all there; None if the base is not (another
    seed or generator version, a missing file)."""
    if not manifest or manifest.get("seed") != seed or manifest.get("version") != GENERATOR_VERSION:
        return None
    present: dict[str, bool] = {}
    for rel in manifest.get("files", {}):
        part = part_of_file(rel)
        present[part] = present.get(part, True) and (root / rel).is_file()
    if not present.get("base", False):
        return None
    claimed = Parts.of_manifest(manifest)
    # a part counts only with its files (and the parts it builds on): a damaged mm/ does not force the base to rebuild
    ok = {f.name: getattr(claimed, f.name) and present.get(f.name, True) for f in fields(claimed)}
    ok["mm_sft"] = ok["mm_sft"] and ok["mm"]
    return Parts(**ok)


def complete_assets(root: Path, seed: int, parts: Parts) -> TinyAssets | None:
    """The layout of ``root`` (every part it holds) when it holds the base and ``parts`` for ``seed``, else None.
    Reads only (no lock): a MANIFEST is written last, so a half-written directory is not claimed complete."""
    root = Path(root)
    have = _valid_parts(read_manifest(root), root, seed)
    return _layout(root, seed, have) if have is not None and have.covers(parts) else None


def make_tiny_assets(
    out_dir,
    seed: int = 0,
    verbose: bool = False,
    with_sft_search: bool = False,
    with_registry: bool = False,
    with_mm: bool = False,
    with_mm_sft: bool = False,
    parts: Parts | None = None,
    code_key: str | None = None,
) -> TinyAssets:
    """Generate (or reuse) the tiny assets under `out_dir` with the optional ``parts`` (or the ``with_*`` flags);
    see the module docstring and docs/contracts.md, "Data and tiny assets".

    Parts already present for this seed and generator version are kept: asking for `with_mm` on a directory
    that has the warm start only adds the multimodal world, and the other way round.

    ``code_key`` (`make-tiny-assets --out`: the cache key of this code, `cache.cache_key`): a directory of another key,
    or of none, is regenerated, and the MANIFEST records the key and `OUT_DIR_MARK` (the launcher then uses the
    directory as it is, or says what it lacks)."""
    want = (parts or Parts()).union(
        Parts.of(sft_search=with_sft_search, registry=with_registry, mm=with_mm, mm_sft=with_mm_sft)
    )
    root = Path(out_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    log = print if verbose else (lambda *a, **k: None)
    with held_lock(root / ".lock", f"{want.describe()} (seed {seed}) in {root}"):
        manifest = read_manifest(root)
        have = _valid_parts(manifest, root, seed)
        mark = {"cache_key": code_key, OUT_DIR_MARK: True} if code_key else {}
        stale = None
        if manifest is not None and have is None:
            stale = f"MANIFEST is for seed {manifest.get('seed')} / version {manifest.get('version')}"
        elif code_key and have is not None and manifest.get("cache_key") != code_key:
            stale, have = f"made by other code (cache_key {manifest.get('cache_key')}, this code's {code_key})", None
        if have is not None and have.covers(want):
            log(f"reusing {root} (seed {seed}, version {GENERATOR_VERSION}, {have.describe()})")
            if any(manifest.get(k) != v for k, v in mark.items()):
                (root / MANIFEST).write_text(json.dumps({**manifest, **mark}, indent=1, sort_keys=True) + "\n")
            return _layout(root, seed, have)
        if stale:
            log(f"{root}: {stale}; regenerating")
        timings: dict[str, float] = dict(manifest.get("timings_s", {})) if have is not None else {}
        if have is None:
            (root / MANIFEST).unlink(missing_ok=True)  # an interrupted run must not look complete
            timings.update(generate_base(root, seed, log))
            have = Parts()
        # adding a part keeps the old MANIFEST until the new one is written: it does not claim the part yet, so an
        # interrupted addition is redone without regenerating what was already complete
        done = have.union(want)
        assets = _layout(root, seed, done)
        t0 = time.perf_counter()
        if done.sft_search and not have.sft_search:
            build_sft_search_model(assets, seed, log)
            timings["sft_search"] = round(time.perf_counter() - t0, 2)
        if done.registry and not have.registry:
            timings.update(generate_registry(root, seed, log))
        if done.mm and not have.mm:
            timings.update(generate_mm(root, seed, log))
        if done.mm_sft and not have.mm_sft:
            t0 = time.perf_counter()
            build_mm_sft_model(root, seed, log)
            timings["mm_sft"] = round(time.perf_counter() - t0, 2)
        new_manifest = {
            "seed": seed,
            "version": GENERATOR_VERSION,
            **done.manifest_fields(),
            **({"registry": manifest_entry(root)} if done.registry else {}),
            **({"mm_sft": mm_sft_manifest_entry(root)} if done.mm_sft else {}),
            "timings_s": timings,
            "files": _file_hashes(root),
            **mark,
        }
        (root / MANIFEST).write_text(json.dumps(new_manifest, indent=1, sort_keys=True) + "\n")
        return assets
