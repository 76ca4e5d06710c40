#!/usr/bin/env python
"""Download the Search-R1 / ASearcher retrieval assets, the e5 encoder, or MMSearch-R1's FVQA data from the Hugging
Face hub (docs/searchr1-facts.md §3), into the layout the next steps read.

    python examples/searchr1/download.py --save_path $WORK [--source searchr1|asearcher|fvqa] [--what LIST]

- Lists the files first and prints, before anything starts: each file's size, where it lands, the time it should
  take at --bandwidth-mbs, and the disk space needed.
- Resumable: an interrupted transfer resumes (huggingface_hub keeps the partial file), files already verified are
  skipped, an interrupted concatenation or unpack continues where it stopped.
- Checks every file against the hub: its size, and its checksum where the hub gives one (sha256 of LFS files, the
  git blob id of small files); a file that fails is fetched again once, then refused.
- Concatenates Search-R1's ``part_*`` into the index file and unpacks ``wiki-18.jsonl.gz`` once.
- Offline or unreachable hub: a clear error naming the fix (HF_ENDPOINT mirror, or copy the files by hand).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from rlinf_ext.retrieval.corpus import CorpusError, unpack_gzip


@dataclass(frozen=True)
class Asset:
    repo_id: str
    patterns: tuple[str, ...]  # files of the repo to fetch (fnmatch on the repo path)
    dest: str = ""  # folder under --save_path the files land in
    repo_type: str = "dataset"
    concat_parts_to: str | None = None  # cat part_* (sorted) into this file under --save_path, then drop the parts
    gunzip: bool = False  # unpack every fetched *.gz once, beside it
    top_level_only: bool = False  # skip files in sub-folders of the repo (an encoder's onnx/, openvino/ copies)


# what transformers needs to load the encoder (the repo also holds onnx/, openvino/ and PyTorch-pickle copies)
ENCODER = Asset(
    "intfloat/e5-base-v2",
    ("*.json", "vocab.txt", "model.safetensors"),
    dest="models/e5-base-v2",
    repo_type="model",
    top_level_only=True,
)

ASSETS: dict[str, dict[str, Asset]] = {
    "searchr1": {
        "index": Asset(
            "PeterJinGo/wiki-18-e5-index", ("part_*",), dest="parts/e5_Flat", concat_parts_to="e5_Flat.index"
        ),
        "index-hnsw64": Asset(
            "PeterJinGo/wiki-18-e5-index-HNSW64", ("part_*",), dest="parts/e5_HNSW64", concat_parts_to="e5_HNSW64.index"
        ),
        "corpus": Asset("PeterJinGo/wiki-18-corpus", ("wiki-18.jsonl.gz",), gunzip=True),
        "encoder": ENCODER,
        "data": Asset("PeterJinGo/nq_hotpotqa_train", ("*.parquet", "**/*.parquet"), dest="data/nq_hotpotqa_train"),
    },
    "asearcher": {
        "corpus": Asset("inclusionAI/ASearcher-Local-Knowledge", ("wiki_corpus.jsonl",)),
        "pages": Asset("inclusionAI/ASearcher-Local-Knowledge", ("wiki_webpages.jsonl",)),
        "encoder": ENCODER,
        "data": Asset("RLinf/Search-R1-Data", ("train.jsonl",), dest="data/Search-R1-Data"),
    },
    # MMSearch-R1: FVQA train/test parquets, the released image-search cache pickles (read them with
    # tools.image_search.backend: cache_pickle, never with pickle.load), and optionally the FVQA_Cache
    # directory layout (tools.image_search.backend: cache_dir). Layouts not verified against the live hub.
    "fvqa": {
        "data": Asset("lmms-lab/FVQA", ("*.parquet",)),
        "cache": Asset("lmms-lab/FVQA", ("*image_search_results_cache.pkl",)),
        "cache_dir": Asset("XLDDD/FVQA_Cache", ("*",)),
    },
}
DEFAULT_WHAT = {"searchr1": "index,corpus,encoder,data", "asearcher": "corpus,pages,encoder,data", "fvqa": "data,cache"}

LAYOUT = """layout under --save_path (the next steps read these paths):
  searchr1   e5_Flat.index                      index: part_aa + part_ab concatenated (parts/ is removed after)
             e5_HNSW64.index                    index-hnsw64 (not fetched by default)
             wiki-18.jsonl.gz, wiki-18.jsonl    corpus: as published, and unpacked once
             models/e5-base-v2/                 encoder (intfloat/e5-base-v2: config, tokenizer, safetensors)
             data/nq_hotpotqa_train/*.parquet   data: train.parquet, test.parquet (test: one merged file)
  asearcher  wiki_corpus.jsonl, wiki_webpages.jsonl, models/e5-base-v2/, data/Search-R1-Data/train.jsonl
  fvqa       *.parquet, *image_search_results_cache.pkl (cache), FVQA_Cache files (cache_dir)
next: rlinf-ext adopt-index --faiss $WORK/e5_Flat.index --corpus $WORK/wiki-18.jsonl --retriever e5 \\
        --model $WORK/models/e5-base-v2 --out $WORK/index/e5_flat"""

STATE_NAME = ".download_state.json"  # under --save_path: files verified (size, mtime, checksum) and concatenations
HASH_RATE = 1.0e9  # bytes/s of sha256 on one core (for the time estimate only)
UNPACK_RATE = 2.0e8  # bytes/s of gunzip output
GZ_RATIO = 3.2  # wiki-18.jsonl.gz unpacks to about 3.2x its size


class DownloadError(RuntimeError):
    pass


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # LFS files
    git_oid: str | None  # small files: the git blob id (sha1 of "blob <size>\0" + content)


def list_remote_files(repo_id: str, repo_type: str = "dataset") -> list[RemoteFile]:
    """Files of a hub repo with their sizes and checksums from the hub API."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    files = []
    for entry in HfApi().list_repo_tree(repo_id, repo_type=repo_type, recursive=True):
        if isinstance(entry, RepoFile):
            lfs = entry.lfs
            files.append(
                RemoteFile(
                    entry.path,
                    int(entry.size),
                    lfs.sha256 if lfs is not None else None,
                    None if lfs is not None else entry.blob_id,
                )
            )
    return files


def fetch_file(asset: Asset, filename: str, save_dir: Path) -> Path:
    """Download one file into ``save_dir`` (hf_hub_download resumes an interrupted transfer)."""
    from huggingface_hub import hf_hub_download

    return Path(
        hf_hub_download(repo_id=asset.repo_id, filename=filename, repo_type=asset.repo_type, local_dir=str(save_dir))
    )


def _select(files: list[RemoteFile], asset: Asset) -> list[RemoteFile]:
    chosen = [
        f
        for f in files
        if any(fnmatch.fnmatch(f.path, p) for p in asset.patterns) and not (asset.top_level_only and "/" in f.path)
    ]
    if not chosen:
        raise DownloadError(
            f"{asset.repo_id} has no file matching {', '.join(asset.patterns)}; "
            "the repo layout changed, download by hand with `hf download`"
        )
    return sorted(chosen, key=lambda f: f.path)


def file_checksum(path: Path, remote: RemoteFile) -> str | None:
    """The checksum of ``path`` in the hub's terms (sha256 for LFS files, git blob id otherwise); None if the hub
    gave none."""
    if remote.sha256:
        digest = hashlib.sha256()
    elif remote.git_oid:
        digest = hashlib.sha1()
        digest.update(f"blob {path.stat().st_size}\0".encode())
    else:
        return None
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(16 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class State:
    """``--save_path/.download_state.json``: which files passed their checks, so a rerun skips them."""

    def __init__(self, save: Path) -> None:
        self.save = save
        self.path = save / STATE_NAME
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}

    @staticmethod
    def _stamp(path: Path, checksum: str | None) -> dict:
        st = path.stat()
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "checksum": checksum}

    def _key(self, path: Path) -> str:
        return str(path.relative_to(self.save))  # the records stay valid when --save_path is moved

    def is_done(self, path: Path, checksum: str | None) -> bool:
        return path.is_file() and self.data.get(self._key(path)) == self._stamp(path, checksum)

    def mark_done(self, path: Path, checksum: str | None) -> None:
        self.data[self._key(path)] = self._stamp(path, checksum)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def plan(source: str, what: list[str]) -> list[tuple[str, Asset, list[RemoteFile]]]:
    if source not in ASSETS:
        raise DownloadError(f"unknown --source {source}; choose one of {', '.join(ASSETS)}")
    unknown = [w for w in what if w not in ASSETS[source]]
    if unknown:
        raise DownloadError(
            f"--source {source} has no {', '.join(unknown)}; it offers "
            f"{', '.join(ASSETS[source])}"
            + (" (pages exist only for --source asearcher)" if "pages" in unknown else "")
        )
    steps = []
    for w in what:
        asset = ASSETS[source][w]
        steps.append((w, asset, _select(list_remote_files(asset.repo_id, asset.repo_type), asset)))
    return steps


def describe_plan(steps, save: Path, bandwidth: float, verify: bool) -> tuple[str, int]:
    """The table printed before anything starts (sizes, destinations, expected times) and the disk space needed."""
    lines = [f"download plan (times at {_human(bandwidth)}/s; --bandwidth-mbs sets your link's speed):"]
    total = needed = 0
    extra_s = 0.0
    for name, asset, files in steps:
        size = sum(f.size for f in files)
        total += size
        needed += size
        if asset.concat_parts_to:
            where = save / asset.concat_parts_to
            needed += size  # the parts and the concatenated file coexist until the parts are removed
            extra_s += size / UNPACK_RATE
        else:
            where = save / asset.dest if asset.dest else save
        if asset.gunzip:
            needed += int(size * GZ_RATIO)
            extra_s += size * GZ_RATIO / UNPACK_RATE
        if verify:
            extra_s += size / HASH_RATE
        lines.append(
            f"  {name:<13} {asset.repo_id} ({len(files)} file{'s' if len(files) > 1 else ''}) "
            f"{_human(size):>9}  ~{_duration(size / bandwidth):>7}  -> {where}"
        )
        for f in files if len(files) <= 4 else []:
            lines.append(f"      {f.path} {_human(f.size)}" + ("" if f.sha256 or f.git_oid else " (no checksum)"))
    lines.append(
        f"  total {_human(total)}: ~{_duration(total / bandwidth)} to download, then ~{_duration(extra_s)} "
        f"to {'check sha256, ' if verify else ''}concatenate and unpack; disk needed {_human(needed)}"
    )
    return "\n".join(lines), needed


def concatenate(parts: list[Path], out: Path) -> None:
    """``cat parts > out`` through ``out.partial``, resumed from its size after an interruption."""
    partial = out.with_name(out.name + ".partial")
    done = partial.stat().st_size if partial.exists() else 0
    total = sum(p.stat().st_size for p in parts)
    if done > total:
        partial.unlink()
        done = 0
    if done:
        print(f"  resuming the concatenation after {_human(done)}", flush=True)
    with open(partial, "ab") as dst:
        offset = 0
        for part in parts:
            size = part.stat().st_size
            if offset + size > done:
                with open(part, "rb") as src:
                    src.seek(max(0, done - offset))
                    shutil.copyfileobj(src, dst, 64 << 20)
            offset += size
    if partial.stat().st_size != total:
        raise DownloadError(
            f"concatenated {partial} has {partial.stat().st_size} bytes, the parts {total}; delete it and rerun"
        )
    os.replace(partial, out)


def _fetch_checked(asset: Asset, f: RemoteFile, save_dir: Path, state: State, verify: bool, label: str) -> Path:
    """A verified local copy of ``f``: skipped if verified before, else downloaded (resuming) and checked; a file
    that fails its check is fetched once more, then refused."""
    target = save_dir / f.path
    expected = (f.sha256 or f.git_oid) if verify else None
    if state.is_done(target, expected):
        print(f"[{label}] {f.path}: verified earlier, skipped", flush=True)
        return target
    for attempt in (1, 2):
        if not (target.is_file() and target.stat().st_size == f.size):
            print(f"[{label}] downloading {asset.repo_id}/{f.path} ({_human(f.size)})", flush=True)
            try:
                target = fetch_file(asset, f.path, save_dir)
            except Exception as e:  # network / hub errors come in many types
                raise DownloadError(
                    f"download of {asset.repo_id}/{f.path} failed ({type(e).__name__}: {e}); rerun "
                    "to resume; offline, copy the file by hand"
                ) from e
        problem = None
        if target.stat().st_size != f.size:
            problem = f"has {target.stat().st_size} bytes, the hub says {f.size}"
        elif expected is not None:
            print(f"[{label}] checking {f.path} ({'sha256' if f.sha256 else 'git blob id'})", flush=True)
            if file_checksum(target, f) != expected:
                problem = f"its {'sha256' if f.sha256 else 'git blob id'} differs from the hub's ({expected})"
        if problem is None:
            state.mark_done(target, expected)
            return target
        target.unlink()
        if attempt == 2:
            raise DownloadError(
                f"{target} {problem} after downloading it twice; check the disk and the network "
                "(or HF_ENDPOINT), then rerun"
            )
        print(f"[{label}] {f.path} {problem}: fetching it again", flush=True)
    raise AssertionError("unreachable")


def download(
    save_path: str | Path,
    source: str = "searchr1",
    what: list[str] | None = None,
    verify: bool = True,
    keep_parts: bool = False,
    bandwidth: float = 100e6,
    dry_run: bool = False,
) -> list[Path]:
    """Fetch, verify and unpack; returns the final paths (index file, corpus jsonl, encoder dir, data files...)."""
    save = Path(save_path)
    what = what or DEFAULT_WHAT[source].split(",")
    try:
        steps = plan(source, what)
    except DownloadError:
        raise
    except Exception as e:  # network / hub errors come in many types (httpx, hub errors)
        raise DownloadError(
            f"cannot reach the Hugging Face hub to list the files ({type(e).__name__}: {e}). "
            "Check the network (or HF_ENDPOINT for a mirror); offline, copy the files into "
            f"{save} by hand (layout: --help) and rerun to verify/unpack them."
        ) from e
    text, needed = describe_plan(steps, save, bandwidth, verify)
    save.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(save).free
    print(f"{text}\n  free at {save}: {_human(free)}", flush=True)
    if dry_run:
        return []
    if needed > free:
        raise DownloadError(f"not enough disk space at {save}: need {_human(needed)}, have {_human(free)}")
    state = State(save)
    outputs: list[Path] = []
    for name, asset, files in steps:
        save_dir = save / asset.dest if asset.dest else save
        if asset.concat_parts_to:
            out = save / asset.concat_parts_to
            expected = ",".join(f.sha256 or f.git_oid or f.path for f in files)
            if state.is_done(out, expected):
                print(f"[{name}] {out}: concatenated and verified earlier, skipped", flush=True)
            else:
                parts = [_fetch_checked(asset, f, save_dir, state, verify, name) for f in files]
                print(f"[{name}] concatenating {len(parts)} parts into {out}", flush=True)
                concatenate(parts, out)
                state.mark_done(out, expected)
                if not keep_parts:
                    for part in parts:
                        part.unlink()
                    shutil.rmtree(save_dir, ignore_errors=True)  # the parts folder and huggingface_hub's records
                    if save_dir.parent != save and not any(save_dir.parent.iterdir()):
                        save_dir.parent.rmdir()  # parts/, once no other index's parts are in it
            outputs.append(out)
            continue
        local = [_fetch_checked(asset, f, save_dir, state, verify, name) for f in files]
        if asset.repo_type == "model":
            outputs.append(save_dir)  # the encoder folder is what the next steps read
            continue
        for target in local:
            if asset.gunzip and target.suffix == ".gz":
                try:
                    outputs.append(unpack_gzip(target, show_progress=True))
                except CorpusError as e:
                    raise DownloadError(str(e)) from e
            else:
                outputs.append(target)
    for path in outputs:
        print(f"ready: {path}", flush=True)
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=LAYOUT, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--save_path", "--save-path", dest="save_path", required=True, help="Target directory ($WORK).")
    parser.add_argument(
        "--source",
        default="searchr1",
        choices=sorted(ASSETS),
        help="searchr1: wiki-18 e5 indexes, corpus, e5 encoder, NQ/HotpotQA data; asearcher: "
        "ASearcher-Local-Knowledge corpus and pages, e5 encoder, RLinf data; fvqa: MMSearch-R1's "
        "FVQA parquets (data), image-search cache pickles (cache), FVQA_Cache (cache_dir).",
    )
    parser.add_argument(
        "--what",
        default=None,
        help="Comma list of what to fetch: "
        + "; ".join(f"{s}: {', '.join(a)}" for s, a in ASSETS.items())
        + ". Default: "
        + "; ".join(f"{s}: {w}" for s, w in DEFAULT_WHAT.items())
        + ".",
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="Skip the checksum check (sha256 of every byte: about a minute per 60 GB).",
    )
    parser.add_argument("--keep-parts", action="store_true", help="Keep part_* after concatenating them.")
    parser.add_argument(
        "--bandwidth-mbs",
        type=float,
        default=100.0,
        help="Your download speed in MB/s, for the expected times printed first (default 100).",
    )
    parser.add_argument("--dry-run", action="store_true", help="Print the plan (sizes, places, times) and stop.")
    args = parser.parse_args(argv)
    try:
        what = args.what or DEFAULT_WHAT[args.source]
        download(
            args.save_path,
            args.source,
            [w.strip() for w in what.split(",") if w.strip()],
            verify=not args.no_verify,
            keep_parts=args.keep_parts,
            bandwidth=args.bandwidth_mbs * 1e6,
            dry_run=args.dry_run,
        )
    except DownloadError as e:
        print(f"download.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
