#!/usr/bin/env python
"""Retrieval server benchmark: batching vs --no-batching, BM25 and dense, on synthetic corpora.

For each corpus size and retriever it builds (once, cached in --work-dir) an index over a synthetic corpus,
then for batching on and off starts the real server and measures
  - start-up: process start -> first /retrieve answered (prebuilt index), and server RSS after the load;
  - RLinf's pattern: --clients concurrent clients, one query per request;
  - Search-R1's pattern: one client sending batches of --batch-queries queries;
and prints throughput (queries/s), p50/p99 request latency, and batching/no-batching ratios, plus whether
both modes returned identical results.

    python benchmarks/retrieval_bench.py --sizes 10000,1000000 --retrievers bm25,dense
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np


def synthetic_corpus(path: Path, n: int, words: list[str], seed: int = 0) -> None:
    """``n`` Search-R1 rows (``"Title"\\ntext``) of 20-60 Zipf-distributed words from ``words``."""
    if path.exists():
        with open(path, "rb") as f:
            if sum(1 for _ in f) == n:
                return
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, len(words) + 1)
    probs = (1.0 / ranks) / (1.0 / ranks).sum()
    lengths = rng.integers(20, 61, size=n)
    tokens = rng.choice(len(words), size=int(lengths.sum()), p=probs)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        pos = 0
        for i in range(n):
            text = " ".join(words[t] for t in tokens[pos:pos + lengths[i]])
            pos += lengths[i]
            title = f"{words[tokens[pos - 1]]} {i}"
            f.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}',
                                "url": f"https://en.wikipedia.org/wiki/Doc_{i}"}) + "\n")
    tmp.replace(path)


def encoder_words(encoder: Path) -> list[str]:
    vocab = (encoder / "vocab.txt").read_text().split("\n")
    return [w for w in vocab if w.isalpha() and len(w) >= 3 and not w.startswith("[")]


def default_encoder(work: Path) -> Path:
    cached = os.environ.get("RLINF_EXT_TINY_ASSETS")
    if cached and (Path(cached) / "models" / "bert-tiny-encoder").is_dir():
        return Path(cached) / "models" / "bert-tiny-encoder"
    from rlinf_ext.assets.tiny import make_tiny_assets

    return make_tiny_assets(work / "tiny_assets", seed=0).bert_encoder


def widened_encoder(base: Path, work: Path, hidden: int, layers: int) -> Path:
    """A random BERT with the base encoder's vocabulary and e5-base's width (768 -> 768-dim embeddings).

    The tiny encoder's 32-dim embeddings make a 1M-passage Flat index 128 MB, so its search is bound by the
    top-k pass, not by reading the index; a real e5-base index is 3 GB, read once per faiss call. With
    `layers=0` the encoder is embeddings + mean pooling (a bag of words): a 1M-passage corpus encodes in minutes
    on a CPU while the index has the real size (one transformer layer of width 768 would take an hour).
    """
    from transformers import BertTokenizerFast

    from rlinf_ext.assets.models import make_bert_encoder, save_hf_model

    out = work / f"encoder_h{hidden}_l{layers}"
    if not (out / "config.json").is_file():
        tok = BertTokenizerFast.from_pretrained(str(base))
        save_hf_model(make_bert_encoder(tok, seed=0, hidden_size=hidden, layers=layers, heads=max(1, hidden // 64)), tok, out)
    return out


def make_queries(corpus: Path, n: int, seed: int = 1) -> list[str]:
    """Queries of 3-8 words taken from random passages (so they have real matches)."""
    rng = random.Random(seed)
    head = []
    with open(corpus, "rb") as f:
        for line in f:
            head.append(json.loads(line))
            if len(head) == 20000:
                break
    out = []
    for _ in range(n):
        words = head[rng.randrange(len(head))]["contents"].split("\n", 1)[1].split()
        start = rng.randrange(max(1, len(words) - 8))
        out.append(" ".join(words[start:start + rng.randint(3, 8)]))
    return out


async def _post(session, url, queries, topk=3):
    t0 = time.perf_counter()
    async with session.post(f"{url}/retrieve", json={"queries": queries, "topk": topk,
                                                     "return_scores": True}) as r:
        r.raise_for_status()
        body = await r.json()
    return time.perf_counter() - t0, body["result"]


async def run_single_query_clients(url: str, queries: list[str], clients: int):
    """``clients`` workers share the query list, each sending one query per request, back to back."""
    import aiohttp

    results: list = [None] * len(queries)
    latencies: list[float] = []
    next_i = iter(range(len(queries)))
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as s:
        async def worker():
            for i in next_i:
                dt, res = await _post(s, url, [queries[i]])
                latencies.append(dt)
                results[i] = res[0]
        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(clients)])
        wall = time.perf_counter() - t0
    return wall, latencies, results


async def run_batch_client(url: str, queries: list[str], batch: int):
    import aiohttp

    results, latencies = [], []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        t0 = time.perf_counter()
        for start in range(0, len(queries), batch):
            dt, res = await _post(s, url, queries[start:start + batch])
            latencies.append(dt)
            results += res
        wall = time.perf_counter() - t0
    return wall, latencies, results


def _ids(results):
    return [[d["document"]["id"] for d in r] for r in results]


def _same(a, b) -> bool:
    if _ids(a) != _ids(b):
        return False
    return all(np.allclose([d["score"] for d in x], [d["score"] for d in y], rtol=1e-5, atol=1e-6)
               for x, y in zip(a, b))


def measure(index: Path, corpus: Path, queries_single, queries_batch, args, no_batching: bool) -> dict:
    import httpx
    import psutil

    from rlinf_ext.retrieval.launch import RetrievalServerProcess

    t0 = time.perf_counter()
    server = RetrievalServerProcess(index, corpus, no_batching=no_batching, max_batch_size=args.max_batch_size,
                                    max_wait_ms=args.max_wait_ms, env={"OMP_NUM_THREADS": str(args.threads)})
    with server as url:
        httpx.post(f"{url}/retrieve", json={"queries": [queries_single[0]]}, timeout=600).raise_for_status()
        startup = time.perf_counter() - t0
        # RSS counts touched pages of memory-mapped files (index, offsets) too; USS is the private memory.
        info = psutil.Process(server.pid).memory_full_info()
        rss_start, uss_start = info.rss, info.uss
        wall_s, lat_s, res_s = asyncio.run(run_single_query_clients(url, queries_single, args.clients))
        wall_b, lat_b, res_b = asyncio.run(run_batch_client(url, queries_batch, args.batch_queries))
        info = psutil.Process(server.pid).memory_full_info()
        rss, uss = info.rss, info.uss
    return {
        "startup_s": startup, "rss_start_mb": rss_start / 2**20, "rss_mb": rss / 2**20,
        "uss_start_mb": uss_start / 2**20, "uss_mb": uss / 2**20,
        "single_qps": len(queries_single) / wall_s, "single_p50_ms": 1e3 * float(np.percentile(lat_s, 50)),
        "single_p99_ms": 1e3 * float(np.percentile(lat_s, 99)),
        "batch_qps": len(queries_batch) / wall_b, "batch_p50_ms": 1e3 * float(np.percentile(lat_b, 50)),
        "batch_p99_ms": 1e3 * float(np.percentile(lat_b, 99)),
        "results_single": res_s, "results_batch": res_b,
    }


def build_if_needed(corpus: Path, index: Path, retriever: str, encoder: Path, args) -> float:
    from rlinf_ext.retrieval.build import build_index
    from rlinf_ext.retrieval.config import BuildConfig

    if (index / "index_meta.json").exists():
        return 0.0
    t0 = time.perf_counter()
    cfg = BuildConfig(corpus=str(corpus), out=str(index), retriever="bm25" if retriever == "bm25" else "e5",
                      model=None if retriever == "bm25" else str(encoder), faiss_type=args.faiss_type,
                      batch_size=256, max_length=64, device="cpu")
    build_index(cfg)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,1000000", help="Comma list of corpus sizes (passages).")
    p.add_argument("--retrievers", default="bm25,dense", help="Comma list: bm25, dense (tiny random BERT, e5 style).")
    p.add_argument("--dense-max-size", type=int, default=100_000,
                   help="Skip dense for larger corpora (encoding 1M passages on 2 CPU cores takes very long).")
    p.add_argument("--work-dir", default="/tmp/retrieval_bench", help="Corpora and indexes are cached here.")
    p.add_argument("--encoder", default=None, help="Encoder dir (default: the tiny assets' bert-tiny-encoder).")
    p.add_argument("--encoder-hidden", type=int, default=None,
                   help="Use a random encoder of this width (e.g. 768, e5-base's) with the base encoder's vocabulary.")
    p.add_argument("--encoder-layers", type=int, default=0, help="Layers of the --encoder-hidden encoder (0: bag of embeddings).")
    p.add_argument("--faiss-type", default="Flat")
    p.add_argument("--clients", type=int, default=64, help="Concurrent single-query clients.")
    p.add_argument("--single-queries", type=int, default=1024, help="Queries sent by the single-query clients.")
    p.add_argument("--batch-queries", type=int, default=512, help="Queries per request of the batch client.")
    p.add_argument("--batch-requests", type=int, default=4, help="Requests sent by the batch client.")
    p.add_argument("--max-batch-size", type=int, default=512)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=2, help="OMP/torch threads of the server.")
    p.add_argument("--json-out", default=None, help="Also write the figures as JSON here.")
    args = p.parse_args(argv)

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    encoder = Path(args.encoder) if args.encoder else default_encoder(work)
    words = encoder_words(encoder)
    if args.encoder_hidden:
        encoder = widened_encoder(encoder, work, args.encoder_hidden, args.encoder_layers)
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        corpus = work / f"corpus_{size}.jsonl"
        t0 = time.perf_counter()
        synthetic_corpus(corpus, size, words)
        print(f"# corpus {size}: {corpus.stat().st_size / 2**20:.0f} MB ({time.perf_counter() - t0:.0f}s)",
              flush=True)
        queries_single = make_queries(corpus, args.single_queries, seed=1)
        queries_batch = make_queries(corpus, args.batch_queries * args.batch_requests, seed=2)
        for retriever in args.retrievers.split(","):
            if retriever == "dense" and size > args.dense_max_size:
                print(f"# skipped dense at {size} passages (> --dense-max-size {args.dense_max_size})", flush=True)
                continue
            width = f"_h{args.encoder_hidden}_l{args.encoder_layers}" if retriever == "dense" and args.encoder_hidden else ""
            index = work / f"index_{retriever}{width}_{size}"
            build_s = build_if_needed(corpus, index, retriever, encoder, args)
            print(f"# {retriever} index {size}: built in {build_s:.0f}s (0 = cached)", flush=True)
            on = measure(index, corpus, queries_single, queries_batch, args, no_batching=False)
            off = measure(index, corpus, queries_single, queries_batch, args, no_batching=True)
            identical = _same(on["results_single"], off["results_single"]) and \
                _same(on["results_batch"], off["results_batch"])
            rows.append({"size": size, "retriever": retriever, "corpus_mb": corpus.stat().st_size / 2**20,
                         "identical": identical,
                         "on": {k: v for k, v in on.items() if not k.startswith("results")},
                         "off": {k: v for k, v in off.items() if not k.startswith("results")}})
            print_row(rows[-1])
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return 0


def print_row(row: dict) -> None:
    on, off = row["on"], row["off"]
    print(f"\n== {row['retriever']} | {row['size']:,} passages | corpus {row['corpus_mb']:.0f} MB | "
          f"identical results batching vs no-batching: {row['identical']}")
    print(f"{'metric':<34}{'batching':>12}{'no-batching':>14}{'ratio on/off':>14}")
    for key, label in [("single_qps", "1-query clients: queries/s"), ("single_p50_ms", "1-query clients: p50 ms"),
                       ("single_p99_ms", "1-query clients: p99 ms"), ("batch_qps", "batch client: queries/s"),
                       ("batch_p50_ms", "batch client: p50 ms/request"),
                       ("batch_p99_ms", "batch client: p99 ms/request"),
                       ("startup_s", "start-up to first answer s"), ("rss_start_mb", "server RSS after start MB"),
                       ("rss_mb", "server RSS after load MB"), ("uss_start_mb", "server USS after start MB"),
                       ("uss_mb", "server USS after load MB")]:
        ratio = on[key] / off[key] if off[key] else float("nan")
        print(f"{label:<34}{on[key]:>12.1f}{off[key]:>14.1f}{ratio:>14.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
