#!/usr/bin/env python
"""Download the Search-R1 / ASearcher retrieval assets, or MMSearch-R1's FVQA data, from the Hugging Face hub
(docs/searchr1-facts.md §3).

    python examples/searchr1/download.py --save_path DIR [--source searchr1|asearcher|fvqa]
                                         [--what index,corpus,pages,data,cache,cache_dir]

- Lists the files first and prints the disk space needed (download + what unpacking adds) before starting.
- Resumable: finished files (size equal to the hub's) are skipped; partial ones resume (hf_hub_download).
- Verifies each file's size against the hub listing (and its LFS sha256 with --verify-sha256, slow on 60 GB).
- Concatenates ``part_*`` into the index file (``e5_Flat.index``) and decompresses ``wiki-18.jsonl.gz``.
- Offline or unreachable hub: a clear error naming the fix (HF_ENDPOINT mirror, or copy the files by hand).
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Asset:
    repo_id: str  # a Hugging Face *dataset* repo
    patterns: tuple[str, ...]  # files of the repo to fetch (fnmatch)
    concat_parts_to: str | None = None  # cat part_* (sorted) into this file
    gunzip: bool = False  # decompress every fetched *.gz next to it


ASSETS: dict[str, dict[str, Asset]] = {
    "searchr1": {
        "index": Asset("PeterJinGo/wiki-18-e5-index", ("part_*",), concat_parts_to="e5_Flat.index"),
        "corpus": Asset("PeterJinGo/wiki-18-corpus", ("wiki-18.jsonl.gz",), gunzip=True),
        "data": Asset("PeterJinGo/nq_hotpotqa_train", ("*.parquet", "**/*.parquet")),
    },
    "asearcher": {
        "corpus": Asset("inclusionAI/ASearcher-Local-Knowledge", ("wiki_corpus.jsonl",)),
        "pages": Asset("inclusionAI/ASearcher-Local-Knowledge", ("wiki_webpages.jsonl",)),
        "data": Asset("RLinf/Search-R1-Data", ("train.jsonl",)),
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


class DownloadError(RuntimeError):
    pass


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None


def list_remote_files(repo_id: str) -> list[RemoteFile]:
    """Files of a dataset repo with their sizes (and LFS sha256) from the hub API."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    files = []
    for entry in HfApi().list_repo_tree(repo_id, repo_type="dataset", recursive=True):
        if isinstance(entry, RepoFile):
            lfs = getattr(entry, "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None else None
            if sha is None and isinstance(lfs, dict):
                sha = lfs.get("sha256")
            files.append(RemoteFile(entry.path, int(entry.size), sha))
    return files


def fetch_file(repo_id: str, filename: str, save_dir: Path) -> Path:
    """Download one file into ``save_dir`` (hf_hub_download resumes an interrupted transfer)."""
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset", local_dir=str(save_dir)))


def _select(files: list[RemoteFile], asset: Asset) -> list[RemoteFile]:
    chosen = [f for f in files if any(fnmatch.fnmatch(f.path, p) for p in asset.patterns)]
    if not chosen:
        raise DownloadError(f"{asset.repo_id} has no file matching {', '.join(asset.patterns)}; "
                            "the repo layout changed, download by hand with huggingface-cli")
    return sorted(chosen, key=lambda f: f.path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(16 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def plan(source: str, what: list[str]) -> list[tuple[str, Asset, list[RemoteFile]]]:
    if source not in ASSETS:
        raise DownloadError(f"unknown --source {source}; choose one of {', '.join(ASSETS)}")
    unknown = [w for w in what if w not in ASSETS[source]]
    if unknown:
        raise DownloadError(f"--source {source} has no {', '.join(unknown)}; it offers "
                            f"{', '.join(ASSETS[source])}" + (" (pages exist only for --source asearcher)"
                                                             if "pages" in unknown else ""))
    steps = []
    for w in what:
        asset = ASSETS[source][w]
        steps.append((w, asset, _select(list_remote_files(asset.repo_id), asset)))
    return steps


def disk_needed(steps) -> tuple[int, str]:
    """Bytes to reserve and how they were estimated (parts are concatenated: counted twice until removed;
    a .gz corpus decompresses to roughly 3.5x its size)."""
    total = 0
    for _, asset, files in steps:
        size = sum(f.size for f in files)
        total += size
        if asset.concat_parts_to:
            total += size
        if asset.gunzip:
            total += int(size * 3.5)
    return total, "downloads + concatenated index + ~3.5x each .gz when decompressed"


def download(save_path: str | Path, source: str = "searchr1", what: list[str] | None = None,
             verify_sha256: bool = False, keep_parts: bool = False) -> list[Path]:
    """Fetch, verify and unpack; returns the final paths (index file, corpus jsonl, pages, data files)."""
    save = Path(save_path)
    what = what or (["data", "cache"] if source == "fvqa" else ["index", "corpus"])
    try:
        steps = plan(source, what)
    except DownloadError:
        raise
    except Exception as e:  # network / hub errors come in many types (requests, httpx, hub errors)
        raise DownloadError(f"cannot reach the Hugging Face hub to list the files ({type(e).__name__}: {e}). "
                            "Check the network (or HF_ENDPOINT for a mirror); offline, copy the files into "
                            f"{save} by hand and rerun to verify/unpack them.") from e
    needed, how = disk_needed(steps)
    save.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(save).free
    print(f"disk space needed: {_human(needed)} ({how}); free at {save}: {_human(free)}", flush=True)
    if needed > free:
        raise DownloadError(f"not enough disk space at {save}: need {_human(needed)}, have {_human(free)}")
    outputs: list[Path] = []
    for name, asset, files in steps:
        local = []
        for f in files:
            target = save / f.path
            if target.exists() and target.stat().st_size == f.size:
                print(f"[{name}] {f.path}: already complete, skipped", flush=True)
            elif asset.concat_parts_to and (save / asset.concat_parts_to).exists() and \
                    (save / asset.concat_parts_to).stat().st_size == sum(x.size for x in files):
                print(f"[{name}] {f.path}: already concatenated into {asset.concat_parts_to}", flush=True)
                local = None
                break
            else:
                print(f"[{name}] downloading {asset.repo_id}/{f.path} ({_human(f.size)})", flush=True)
                try:
                    target = fetch_file(asset.repo_id, f.path, save)
                except Exception as e:
                    raise DownloadError(f"download of {asset.repo_id}/{f.path} failed ({type(e).__name__}: {e}); "
                                        "rerun to resume; offline, copy the file by hand") from e
            if target.stat().st_size != f.size:
                raise DownloadError(f"{target} has {target.stat().st_size} bytes, the hub says {f.size}; "
                                    "delete it and rerun")
            if verify_sha256 and f.sha256 and _sha256(target) != f.sha256:
                raise DownloadError(f"{target}: sha256 differs from the hub's; delete it and rerun")
            local.append(target)
        if asset.concat_parts_to:
            out = save / asset.concat_parts_to
            if local is not None:
                tmp = out.with_name(out.name + ".tmp")
                with open(tmp, "wb") as dst:
                    for part in local:
                        with open(part, "rb") as src:
                            shutil.copyfileobj(src, dst, 64 << 20)
                if tmp.stat().st_size != sum(f.size for f in files):
                    raise DownloadError(f"concatenated {out} has the wrong size; delete it and rerun")
                tmp.replace(out)
                if not keep_parts:
                    for part in local:
                        part.unlink()
            print(f"[{name}] index: {out}", flush=True)
            outputs.append(out)
            continue
        for target in local:
            if asset.gunzip and target.suffix == ".gz":
                out = target.with_suffix("")
                done_marker = out.with_name(out.name + ".complete")
                if not (out.exists() and done_marker.exists()):
                    print(f"[{name}] decompressing {target.name}", flush=True)
                    tmp = out.with_name(out.name + ".tmp")
                    with gzip.open(target, "rb") as src, open(tmp, "wb") as dst:
                        shutil.copyfileobj(src, dst, 64 << 20)
                    tmp.replace(out)
                    done_marker.write_text(str(out.stat().st_size))
                outputs.append(out)
            else:
                outputs.append(target)
    for path in outputs:
        print(f"ready: {path}", flush=True)
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save_path", "--save-path", dest="save_path", required=True, help="Target directory.")
    parser.add_argument("--source", default="searchr1", choices=sorted(ASSETS),
                        help="searchr1: wiki-18 e5 Flat index + corpus (+ NQ/HotpotQA data); asearcher: "
                             "ASearcher-Local-Knowledge corpus and pages (+ RLinf data); fvqa: MMSearch-R1's "
                             "FVQA parquets (data), image-search cache pickles (cache), FVQA_Cache (cache_dir).")
    parser.add_argument("--what", default=None,
                        help="Comma list of index, corpus, pages, data, cache, cache_dir "
                             "(default: index,corpus; for --source fvqa: data,cache).")
    parser.add_argument("--verify-sha256", action="store_true", help="Also check LFS sha256 (reads every byte).")
    parser.add_argument("--keep-parts", action="store_true", help="Keep part_* after concatenating them.")
    args = parser.parse_args(argv)
    try:
        what = args.what or ("data,cache" if args.source == "fvqa" else "index,corpus")
        download(args.save_path, args.source, [w.strip() for w in what.split(",") if w.strip()],
                 verify_sha256=args.verify_sha256, keep_parts=args.keep_parts)
    except DownloadError as e:
        print(f"download.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
