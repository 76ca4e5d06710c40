"""Corpus and pages stores over jsonl files, read lazily through an on-disk line-offset index.

Start-up must not parse a 21M-passage corpus into Python objects (the peers' multi-minute load), so the
stores keep only a numpy array of ``(start, length)`` byte ranges (memory-mapped from a cache file built
once) and read + parse a row with ``os.pread`` when it is asked for. ``os.pread`` takes an explicit
offset, so concurrent readers need no lock.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from rlinf_ext.tools.documents import strip_title_quotes

FINGERPRINT_CHUNK = 1 << 20  # bytes hashed at the head and at the tail of a file
_SCAN_BLOCK = 64 << 20


class CorpusError(ValueError):
    """A corpus or pages file is missing or malformed; the message names the file and the fix."""


def file_fingerprint(path: str | os.PathLike) -> str:
    """Fast checksum of a (possibly 20+ GB) file: its size plus a blake2b hash of the first and last 1 MiB.

    Not a full-content hash (that would take minutes on wiki-18); it catches a different, truncated,
    re-generated or swapped file, which is what the index/corpus match check needs.
    """
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.blake2b(digest_size=16)
    digest.update(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(FINGERPRINT_CHUNK))
        if size > FINGERPRINT_CHUNK:
            f.seek(max(FINGERPRINT_CHUNK, size - FINGERPRINT_CHUNK))
            digest.update(f.read(FINGERPRINT_CHUNK))
    return f"size={size};head_tail_blake2b={digest.hexdigest()}"


def scan_line_ranges(path: str | os.PathLike, show_progress: bool = False) -> np.ndarray:
    """Byte ranges ``[[start, length], ...]`` (int64) of the non-blank lines of ``path``, newline excluded."""
    size = os.path.getsize(path)
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"indexing lines of {Path(path).name}")
    with open(path, "rb") as f:
        pos = 0
        line_start = 0
        while True:
            block = f.read(_SCAN_BLOCK)
            if not block:
                break
            newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10).astype(np.int64) + pos
            if len(newlines):
                starts.append(np.concatenate([[line_start], newlines[:-1] + 1]))
                ends.append(newlines)
                line_start = int(newlines[-1]) + 1
            pos += len(block)
            if bar is not None:
                bar.update(len(block))
        if line_start < pos:  # last line without a trailing newline
            starts.append(np.array([line_start], dtype=np.int64))
            ends.append(np.array([pos], dtype=np.int64))
    if bar is not None:
        bar.close()
    if not starts:
        return np.zeros((0, 2), dtype=np.int64)
    start = np.concatenate(starts)
    length = np.concatenate(ends) - start
    ranges = np.stack([start, length], axis=1)
    # Drop blank lines ("" or a lone "\r"); a real row is at least "{}".
    return np.ascontiguousarray(ranges[length > 1])


def _cache_candidates(path: Path, cache_dir: Path | None, suffix: str) -> list[Path]:
    name = f"{path.name}.{suffix}.npy"
    dirs = ([cache_dir] if cache_dir is not None else []) + [path.parent]
    return [d / name for d in dirs]


def _load_or_build_cached(path: Path, cache_dir: Path | None, suffix: str, build, show_progress: bool) -> np.ndarray:
    """Memory-map ``<name>.<suffix>.npy`` (next to the index or the corpus) when its sidecar fingerprint
    matches the file; otherwise build it and save it to the first writable candidate directory."""
    fingerprint = file_fingerprint(path)
    candidates = _cache_candidates(path, cache_dir, suffix)
    for cache in candidates:
        meta = cache.with_suffix(".json")
        if cache.exists() and meta.exists():
            try:
                if json.loads(meta.read_text()).get("fingerprint") == fingerprint:
                    return np.load(cache, mmap_mode="r")
            except (OSError, ValueError):
                pass  # unreadable cache: rebuild below
    array = build(show_progress)
    for cache in candidates:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
            with open(tmp, "wb") as f:
                np.save(f, array)
            os.replace(tmp, cache)
            cache.with_suffix(".json").write_text(json.dumps({"fingerprint": fingerprint, "rows": len(array)}))
            return np.load(cache, mmap_mode="r")
        except OSError:
            continue  # read-only location: try the next one
    return array  # nowhere writable: keep it in memory for this process


def split_contents(contents: str) -> tuple[str, str]:
    """Split Search-R1 ``contents`` = ``'"Title"\\ntext'`` into ``(title, text)``.

    Without a newline the whole string is the text and the title is empty. Surrounding double quotes
    of the title line are removed (one pair only).
    """
    head, sep, text = contents.partition("\n")
    if not sep:
        return "", contents
    return strip_title_quotes(head.strip()), text


def normalize_doc(row: dict, row_index: int) -> dict:
    """The doc every peer client expects: ``id``, ``contents``, plus ``title``, ``text``, ``url`` when known."""
    doc = dict(row)
    if "id" not in doc:
        doc["id"] = str(row_index)
    elif not isinstance(doc["id"], str):
        doc["id"] = str(doc["id"])
    if "contents" not in doc:
        title, text = doc.get("title", ""), doc.get("text", "")
        doc["contents"] = f'"{title}"\n{text}' if title else str(text)
    if "title" not in doc or "text" not in doc:
        title, text = split_contents(str(doc["contents"]))
        doc.setdefault("title", title)
        doc.setdefault("text", text)
    return doc


def passage_text_for_index(doc: dict) -> str:
    """The text that BM25 and dense encoders index: the ``contents`` field (title line + text)."""
    return str(doc["contents"])


@dataclass
class _LineFile:
    path: Path
    ranges: np.ndarray  # (n, 2) int64, usually a read-only memmap

    def __post_init__(self) -> None:
        self._fd = os.open(self.path, os.O_RDONLY)

    def read_raw(self, row: int) -> bytes:
        start, length = self.ranges[row]
        return os.pread(self._fd, int(length), int(start))

    def parse(self, row: int) -> dict:
        raw = self.read_raw(row)
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise CorpusError(f"{self.path}: row {row} is not valid JSON ({e}); fix or remove that line.") from e
        if not isinstance(value, dict):
            raise CorpusError(f"{self.path}: row {row} is a JSON {type(value).__name__}, expected an object.")
        return value

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


GZIP_SUFFIX = ".gz"
UNPACK_STATE_SUFFIX = ".unpack.json"  # beside the unpacked file: what it was unpacked from, how far it got
_UNPACK_BLOCK = 64 << 20


def unpacked_path(gz_path: str | os.PathLike) -> Path:
    """Where ``wiki-18.jsonl.gz`` is unpacked: ``wiki-18.jsonl`` beside it."""
    return Path(gz_path).with_suffix("")


def _read_state(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_state(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def unpack_gzip(gz_path: str | os.PathLike, show_progress: bool = False) -> Path:
    """Unpack a gzip-compressed corpus once into the plain jsonl beside it; returns that path.

    The store serves rows by byte offset (``os.pread``), which a gzip stream cannot give without decompressing
    from its start, so the corpus is unpacked once (wiki-18: 4.5 GB -> 14 GB, a few minutes). Resumable: after
    every flushed block the state file records the bytes written; an interrupted run keeps them, decompresses up
    to that point without writing, and appends the rest. A finished unpack (state ``done`` for this very .gz) is
    reused at once. A truncated or corrupt .gz is a CorpusError naming the fix.
    """
    gz = Path(gz_path)
    out = unpacked_path(gz)
    partial = out.with_name(out.name + ".partial")
    state_path = out.with_name(out.name + UNPACK_STATE_SUFFIX)
    source = file_fingerprint(gz)
    state = _read_state(state_path)
    if (
        state.get("source") == source
        and state.get("done")
        and out.is_file()
        and out.stat().st_size == state.get("bytes")
    ):
        return out
    done = 0
    if state.get("source") == source and not state.get("done") and partial.is_file():
        done = min(int(state.get("bytes", 0)), partial.stat().st_size)
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(
            total=gz.stat().st_size,
            unit="B",
            unit_scale=True,
            desc=f"unpacking {gz.name}" + (f" (resuming after {done / 2**30:.1f} GiB)" if done else ""),
        )
    try:
        with open(gz, "rb") as raw, gzip.GzipFile(fileobj=raw) as src, open(partial, "r+b" if done else "wb") as dst:
            dst.truncate(done)  # bytes past the last recorded block may be half written
            dst.seek(done)
            skip = done
            while skip:  # a gzip stream has no seek: decompress the part already written, without writing it
                block = src.read(min(_UNPACK_BLOCK, skip))
                if not block:
                    raise EOFError("stream ended before the bytes already unpacked")
                skip -= len(block)
            written, read_before = done, raw.tell()
            while block := src.read(_UNPACK_BLOCK):
                dst.write(block)
                dst.flush()
                os.fsync(dst.fileno())
                written += len(block)
                _write_state(state_path, {"source": source, "bytes": written, "done": False})
                if bar is not None:
                    bar.update(raw.tell() - read_before)
                    read_before = raw.tell()
    except (EOFError, OSError, zlib.error) as e:
        if isinstance(e, OSError) and not isinstance(e, gzip.BadGzipFile) and e.errno is not None:
            raise CorpusError(
                f"cannot unpack {gz} into {partial} ({e}); free disk space or make "
                f"{out.parent} writable, then rerun (it resumes)"
            ) from e
        raise CorpusError(
            f"{gz} is truncated or not gzip ({type(e).__name__}: {e}); the download was cut off: "
            "rerun examples/searchr1/download.py (it resumes and checks the hub's sha256) or fetch "
            "the file again"
        ) from e
    finally:
        if bar is not None:
            bar.close()
    os.replace(partial, out)
    _write_state(state_path, {"source": source, "bytes": written, "done": True})
    return out


def plain_corpus_path(path: str | os.PathLike, show_progress: bool = False) -> Path:
    """The plain jsonl of a corpus: ``path`` itself, or for a ``.gz`` its unpacked copy (unpacked once)."""
    path = Path(path)
    if path.suffix != GZIP_SUFFIX:
        return path
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path} (pass --corpus pointing to a .jsonl or .jsonl.gz file)")
    return unpack_gzip(path, show_progress=show_progress)


class CorpusStore:
    """Random access to the rows of a Search-R1 / ASearcher jsonl corpus by row number (= index id).

    ``CorpusStore.open(path, cache_dir=index_dir)`` memory-maps the cached offsets (built once, in a few
    seconds per GB). ``get(i)`` / ``get_many(ids)`` return normalised docs (see ``normalize_doc``).
    """

    def __init__(self, path: Path, ranges: np.ndarray) -> None:
        self.path = path
        self._file = _LineFile(path, ranges)

    @classmethod
    def open(
        cls, path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, show_progress: bool = False
    ) -> CorpusStore:
        path = Path(path)
        if not path.is_file():
            raise CorpusError(f"corpus file not found: {path} (pass --corpus pointing to a .jsonl or .jsonl.gz file)")
        path = plain_corpus_path(path, show_progress=show_progress)
        ranges = _load_or_build_cached(
            path,
            Path(cache_dir) if cache_dir else None,
            "offsets",
            lambda progress: scan_line_ranges(path, progress),
            show_progress,
        )
        return cls(path, ranges)

    def __len__(self) -> int:
        return len(self._file.ranges)

    def get(self, row: int) -> dict:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} outside corpus of {len(self)} rows")
        return normalize_doc(self._file.parse(row), row)

    def get_many(self, rows) -> list[dict]:
        return [self.get(int(r)) for r in rows]

    def iter_texts(self, start: int = 0, stop: int | None = None):
        """Indexed text of rows ``start..stop`` in order, read sequentially (for index building)."""
        stop = len(self) if stop is None else stop
        for row in range(start, stop):
            yield passage_text_for_index(self.get(row))

    def close(self) -> None:
        self._file.close()


def normalize_url(url: str) -> str:
    """ASearcher's page-key rewrite: ``.../index.php/Title`` and ``.../index.php?title=Title`` are one page."""
    return url.strip().replace("index.php/", "index.php?title=")


def url_hash(url: str) -> int:
    """Stable signed 64-bit key of a normalised url (blake2b), used in the sorted lookup array."""
    return int.from_bytes(hashlib.blake2b(normalize_url(url).encode(), digest_size=8).digest(), "little", signed=True)


def _build_page_keys(path: Path, ranges: np.ndarray, show_progress: bool) -> np.ndarray:
    """Sorted ``[[url_hash, row], ...]`` over the rows of a pages jsonl (parses each row once)."""
    lines = _LineFile(path, ranges)
    keys = np.empty((len(ranges), 2), dtype=np.int64)
    iterator = range(len(ranges))
    if show_progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, desc=f"hashing urls of {path.name}", unit="page")
    try:
        for row in iterator:
            page = lines.parse(row)
            url = page.get("url")
            if not isinstance(url, str):
                raise CorpusError(f"{path}: row {row} has no string 'url' field; every page row needs one.")
            keys[row] = (url_hash(url), row)
    finally:
        lines.close()
    return keys[np.argsort(keys[:, 0], kind="stable")]


class PagesStore:
    """``url -> page row`` over ASearcher's ``wiki_webpages.jsonl`` without loading it into a dict.

    Keeps a sorted array of 64-bit url hashes (memory-mapped cache) and verifies the url of the row it
    finds, so a hash collision can never return the wrong page.
    """

    def __init__(self, path: Path, ranges: np.ndarray, keys: np.ndarray) -> None:
        self.path = path
        self._file = _LineFile(path, ranges)
        self._keys = keys

    @classmethod
    def open(
        cls, path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, show_progress: bool = False
    ) -> PagesStore:
        path = Path(path)
        if not path.is_file():
            raise CorpusError(f"pages file not found: {path} (pass --pages pointing to wiki_webpages.jsonl)")
        cache = Path(cache_dir) if cache_dir else None
        ranges = _load_or_build_cached(
            path, cache, "offsets", lambda progress: scan_line_ranges(path, progress), show_progress
        )
        keys = _load_or_build_cached(
            path, cache, "urlkeys", lambda progress: _build_page_keys(path, ranges, progress), show_progress
        )
        return cls(path, ranges, keys)

    def __len__(self) -> int:
        return len(self._keys)

    def lookup(self, url: str) -> dict | None:
        """The page row for ``url`` (after ``normalize_url``), or None if the url is unknown."""
        wanted = normalize_url(url)
        key = url_hash(url)
        hashes = self._keys[:, 0]
        pos = int(np.searchsorted(hashes, key, side="left"))
        while pos < len(hashes) and hashes[pos] == key:
            page = self._file.parse(int(self._keys[pos, 1]))
            if normalize_url(str(page.get("url", ""))) == wanted:
                return page
            pos += 1
        return None

    def close(self) -> None:
        self._file.close()
