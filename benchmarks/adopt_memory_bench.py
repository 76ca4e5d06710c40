#!/usr/bin/env python
"""Memory of adopting and serving a bare Flat faiss file the shape of Search-R1's e5_Flat.index (1M rows by default,
1/21 of wiki-18), read as RssAnon (the process's own memory) and RssFile (mapped page cache) from /proc/PID/status.

Written offline into --work-dir, then deleted (unless --keep):
  - ``wiki-18.jsonl.gz``: N rows ``{"id", "contents": "\\"Doc i\\"\\nwords..."}`` as published;
  - a 768-d encoder: a BERT without layers over the tiny encoder's vocabulary (retrieval_bench.py's bag-of-words
    encoder; fast enough to serve 1M rows on 2 cores);
  - ``e5_Flat.index``: ``faiss.write_index`` of an ``IndexFlatIP``, N x 768 float32 (N=1M: 3.07 GB). The vectors are
    random unit vectors, except the rows adopt-index re-encodes (``adopt.check_rows``), which hold their passages'
    real vectors so that the rank-1 check passes; only the memory is measured here, the answers are tested in
    tests/retrieval/test_adopt.py.
Then, each in its own process:
  1. ``adopt-index`` (the .gz corpus unpacked once, the check's one search over the index);
  2. ``serve-retriever`` over the adopted directory: at /health, after one query (every page of the index read
     once), after a 64-query batch; peak RssAnon sampled every 10 ms;
  3. the same server with ``--in-ram`` (the index copied into the process), for comparison.

    nice python benchmarks/adopt_memory_bench.py --rows 1000000 --work-dir /work/tmp/adopt_bench
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Self

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retrieval_bench import bow_encoder, default_encoder, encoder_words

from rlinf_ext.retrieval.memory import ANON_MB, FILE_MB, process_memory

DIM = 768
CHILD_ADOPT = "--child-adopt"


class PeakSampler:
    """Highest RssAnon of ``pid`` seen while running (sampled every ``period_s``)."""

    def __init__(self, pid: int | None = None, period_s: float = 0.01) -> None:
        self.pid, self.period_s, self.peak_anon = pid, period_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_anon = max(self.peak_anon, process_memory(self.pid)[ANON_MB])
            except (OSError, KeyError):
                return
            time.sleep(self.period_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def write_corpus(path: Path, rows: int, words: list[str], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(words), size=(rows, 10))
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        for i in range(rows):
            text = " ".join(words[j] for j in picks[i])
            f.write(json.dumps({"id": str(i), "contents": f'"Doc {i}"\n{text}'}) + "\n")


def write_index(path: Path, corpus_gz: Path, encoder: Path, rows: int, check_sample: int, seed: int = 0) -> None:
    """Random unit vectors, the checked rows' real passage vectors, written by faiss.write_index."""
    import faiss

    from rlinf_ext.retrieval.adopt import check_rows
    from rlinf_ext.retrieval.encoder import EncoderSpec, TextEncoder

    checked = check_rows(rows, check_sample)
    wanted = set(checked.tolist())
    with gzip.open(corpus_gz, "rt", encoding="utf-8") as f:
        texts = {i: json.loads(line)["contents"] for i, line in enumerate(f) if i in wanted}
    real = TextEncoder(EncoderSpec.for_retriever("e5", str(encoder))).encode(
        [texts[int(r)] for r in checked], is_query=False
    )
    rng = np.random.default_rng(seed)
    index = faiss.IndexFlatIP(DIM)
    step = 100_000
    for start in range(0, rows, step):
        block = rng.standard_normal((min(step, rows - start), DIM), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        inside = checked[(checked >= start) & (checked < start + len(block))]
        block[inside - start] = real[np.searchsorted(checked, inside)]
        index.add(block)
    faiss.write_index(index, str(path))


def child_adopt(args_json: str) -> None:
    """In a fresh process: memory after the imports, after adopting, and the peak while adopting."""
    from rlinf_ext.retrieval.adopt import adopt_index
    from rlinf_ext.retrieval.config import AdoptConfig

    cfg = AdoptConfig(**json.loads(args_json))
    before = process_memory()
    t0 = time.perf_counter()
    with PeakSampler() as peak:
        adopt_index(cfg, show_progress=False)
    after = process_memory()
    print(
        json.dumps(
            {"before": before, "after": after, "peak_anon_mb": peak.peak_anon, "wall_s": time.perf_counter() - t0}
        )
    )


def serve_figures(index_dir: Path, corpus: Path, queries: list[str], in_ram: bool, threads: int) -> dict:
    import httpx

    from rlinf_ext.retrieval.launch import RetrievalServerProcess

    t0 = time.perf_counter()
    server = RetrievalServerProcess(index_dir, corpus, in_ram=in_ram, threads=threads, startup_timeout_s=1800)
    with server as url:
        startup = time.perf_counter() - t0
        out = {"startup_s": startup, "ready": process_memory(server.pid)}
        with PeakSampler(server.pid) as peak:
            httpx.post(f"{url}/retrieve", json={"queries": queries[:1], "topk": 3}, timeout=600).raise_for_status()
            out["one_query"] = process_memory(server.pid)
            httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": 3}, timeout=600).raise_for_status()
            out["batch"] = process_memory(server.pid)
        out["peak_anon_mb"] = max(peak.peak_anon, out["ready"][ANON_MB])
        out["open_s"] = httpx.get(f"{url}/health", timeout=60).json()["searcher_open_s"]
    return out


def _row(label: str, m: dict, extra: str = "") -> str:
    return f"  {label:<44} {m[ANON_MB]:>9.0f} {m[FILE_MB]:>10.0f}  {extra}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="Vectors in the Flat file (wiki-18: 21015324).")
    p.add_argument("--work-dir", default="/tmp/adopt_memory_bench")
    p.add_argument("--check-sample", type=int, default=16, help="adopt-index --check-sample.")
    p.add_argument("--threads", type=int, default=2, help="Encoder threads of adopt-index and the server.")
    p.add_argument("--no-in-ram", action="store_true", help="Skip the --in-ram comparison (it holds the index in RAM).")
    p.add_argument("--keep", action="store_true", help="Keep the work dir (index file, corpus, adopted dir).")
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == CHILD_ADOPT:
        child_adopt(sys.argv[2])
        return 0
    args = p.parse_args(argv)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    need = args.rows * DIM * 4 * 1.1 + 200e6
    free = shutil.disk_usage(work).free
    if free < need:
        raise SystemExit(f"{work}: {free / 1e9:.1f} GB free, the index file needs {need / 1e9:.1f} GB")
    try:
        t0 = time.perf_counter()
        base = default_encoder(work)
        encoder, words = bow_encoder(base, work, DIM), encoder_words(base)
        corpus_gz, index_file = work / "wiki-18.jsonl.gz", work / "e5_Flat.index"
        write_corpus(corpus_gz, args.rows, words)
        write_index(index_file, corpus_gz, encoder, args.rows, args.check_sample)
        print(
            f"# wrote {index_file} ({index_file.stat().st_size / 1e9:.2f} GB, {args.rows} x {DIM}) and "
            f"{corpus_gz.name} ({corpus_gz.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        out = work / "index" / "e5_flat"
        cfg = {
            "faiss": str(index_file),
            "corpus": str(corpus_gz),
            "retriever": "e5",
            "model": str(encoder),
            "out": str(out),
            "check_sample": args.check_sample,
            "device": "cpu",
            "threads": args.threads,
        }
        child = subprocess.run(
            [sys.executable, __file__, CHILD_ADOPT, json.dumps(cfg)], capture_output=True, text=True, check=False
        )
        if child.returncode != 0:
            raise SystemExit(f"adopt-index failed:\n{child.stderr[-3000:]}")
        adopt = json.loads(child.stdout.strip().splitlines()[-1])
        corpus = work / "wiki-18.jsonl"
        queries = [f"Doc {i} " + " ".join(words[i : i + 6]) for i in range(64)]
        mapped = serve_figures(out, corpus, queries, in_ram=False, threads=args.threads)
        in_ram = None if args.no_in_ram else serve_figures(out, corpus, queries, in_ram=True, threads=args.threads)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.rows} x {DIM} fp32 Flat file ({args.rows * DIM * 4 / 1e9:.2f} GB); MB from /proc/PID/status")
    print(f"  {'':<44} {'RssAnon':>9} {'RssFile':>10}")
    print("adopt-index (own process)")
    print(_row("after imports (torch, faiss)", adopt["before"]))
    print(_row("after adopting", adopt["after"], f"({adopt['wall_s']:.1f} s: unpack, offsets, check)"))
    print(f"  {'peak while adopting':<44} {adopt['peak_anon_mb']:>9.0f}")
    for name, fig in (("serve-retriever, memory-mapped", mapped), ("serve-retriever --in-ram", in_ram)):
        if fig is None:
            continue
        print(f"{name} (server process; start-up {fig['startup_s']:.1f} s, index opened in {fig['open_s']:.2f} s)")
        print(_row("ready (/health answers)", fig["ready"]))
        print(_row("after 1 query (every index page read once)", fig["one_query"]))
        print(_row("after a 64-query batch", fig["batch"]))
        print(f"  {'peak while answering':<44} {fig['peak_anon_mb']:>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
