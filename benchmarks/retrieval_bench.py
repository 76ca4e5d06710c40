#!/usr/bin/env python
"""Retrieval server benchmark by corpus size: BM25 and dense index types over synthetic corpora.

For each size it builds once (cached in --work-dir) a synthetic corpus, a BM25 index and one dense index per
--types preset over the same passage embeddings, then starts the real server for each (memory-mapped; with
--in-ram-too also read into RAM) and measures:
  - start-up: process start -> first /retrieve answered (page cache warm: the index files are read first), and
    the part of it spent opening the searcher (encoder + index: "open s", from /health);
  - RSS when /health first answers ("ready"), after the first answer, and after the load ("warm"), split into the
    process's own memory and mapped file pages (page cache the kernel can evict);
  - queries/s and p50/p99 latency with --clients concurrent clients sending one query per request;
  - recall@k of every dense type against Flat on the same queries (from the servers' answers);
  - BM25: the same load against a server started from --baseline-src (an older checkout), results compared.

Dense vectors: a bag-of-words encoder of e5-base's width (768, no transformer layers) whose embedding LayerNorm
is the identity, so a passage vector is the normalised sum of its token vectors. Passages are embedded straight
into the build's embedding memmap with that formula (checked against the real encoder on a sample; encoding
1M passages through transformers takes an hour on 2 cores); queries go through the real encoder in the server.

    python benchmarks/retrieval_bench.py --sizes 250000,500000,1000000 --types bm25,flat,flat-fp16,approx
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

DENSE_TYPES = ("flat", "flat-fp16", "approx")


def synthetic_corpus(
    path: Path,
    n: int,
    words: list[str],
    seed: int = 0,
    topics: int = 1000,
    topic_words: int = 30,
    topic_share: float = 0.6,
) -> None:
    """``n`` Search-R1 rows (``"Title"\ntext``) of 20-60 words, like encyclopedia passages: each passage has a
    topic, ``topic_share`` of its words come from that topic's ``topic_words`` words and the rest from the whole
    vocabulary, both Zipf-distributed, in random order. (Topics give dense vectors the cluster structure of real
    text embeddings; without them the vectors are close to uniform on the sphere, the worst case of every
    approximate index.)"""
    if path.exists():
        with open(path, "rb") as f:
            if sum(1 for _ in f) == n:
                return
    rng = np.random.default_rng(seed)

    def zipf(m: int) -> np.ndarray:
        w = 1.0 / np.arange(1, m + 1)
        return w / w.sum()

    vocab_of_topic = np.array([rng.choice(len(words), size=topic_words, replace=False) for _ in range(topics)])
    lengths = rng.integers(20, 61, size=n)
    doc_topic = rng.integers(0, topics, size=n)
    owner = np.repeat(np.arange(n), lengths)
    from_topic = rng.random(len(owner)) < topic_share
    tokens = rng.choice(len(words), size=len(owner), p=zipf(len(words)))
    picks = rng.choice(topic_words, size=int(from_topic.sum()), p=zipf(topic_words))
    tokens[from_topic] = vocab_of_topic[doc_topic[owner[from_topic]], picks]
    tokens = tokens[np.lexsort((rng.random(len(owner)), owner))]  # shuffle within each passage
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        pos = 0
        for i in range(n):
            text = " ".join(words[t] for t in tokens[pos : pos + lengths[i]])
            pos += lengths[i]
            title = f"{words[vocab_of_topic[doc_topic[i], 0]]} {i}"
            f.write(
                json.dumps(
                    {"id": str(i), "contents": f'"{title}"\n{text}', "url": f"https://en.wikipedia.org/wiki/Doc_{i}"}
                )
                + "\n"
            )
    tmp.replace(path)


def encoder_words(encoder: Path) -> list[str]:
    vocab = (encoder / "vocab.txt").read_text().split("\n")
    return [w for w in vocab if w.isalpha() and len(w) >= 3 and not w.startswith("[")]


def default_encoder(work: Path) -> Path:
    cached = os.environ.get("RLINF_EXT_TINY_ASSETS")
    if cached and (Path(cached) / "models" / "bert-tiny-encoder").is_dir():
        return Path(cached) / "models" / "bert-tiny-encoder"
    from rlinf_ext.assets.core.tiny import make_tiny_assets

    return make_tiny_assets(work / "tiny_assets", seed=0).bert_encoder


def bow_encoder(base: Path, work: Path, hidden: int) -> Path:
    """A BERT without layers, the base encoder's vocabulary, width ``hidden``, and an identity embedding LayerNorm:
    token vectors are standardised (mean 0, variance 1), position / token-type vectors are 0, gain 1, bias 0."""
    import torch
    from transformers import BertTokenizerFast

    from rlinf_ext.assets.core.models import make_bert_encoder, save_hf_model

    out = work / f"encoder_bow_h{hidden}"
    if not (out / "config.json").is_file():
        tok = BertTokenizerFast.from_pretrained(str(base))
        model = make_bert_encoder(tok, seed=0, hidden_size=hidden, layers=0, heads=max(1, hidden // 64))
        emb = model.embeddings
        with torch.no_grad():
            w = emb.word_embeddings.weight
            w.sub_(w.mean(dim=1, keepdim=True))
            w.div_(w.std(dim=1, unbiased=False, keepdim=True).clamp(min=1e-6))  # the padding row stays 0
            emb.position_embeddings.weight.zero_()
            emb.token_type_embeddings.weight.zero_()
            emb.LayerNorm.weight.fill_(1.0)
            emb.LayerNorm.bias.zero_()
        save_hf_model(model, tok, out)
    return out


def write_embeddings(store, out_dir: Path, encoder_dir: Path, max_length: int, chunk: int = 50_000) -> None:
    """Fill ``out_dir``'s embedding memmap with the bag-of-words formula and mark it complete for build-index."""
    import scipy.sparse as sp
    import torch
    from transformers import AutoModel, AutoTokenizer

    from rlinf_ext.retrieval.corpus import file_fingerprint
    from rlinf_ext.retrieval.dense import EMBEDDINGS_NAME, progress_key, record_progress
    from rlinf_ext.retrieval.encoder import EncoderSpec, TextEncoder
    from rlinf_ext.retrieval.metadata import model_fingerprint

    spec = EncoderSpec.for_retriever("e5", str(encoder_dir), max_length=max_length)
    tok = AutoTokenizer.from_pretrained(str(encoder_dir))
    weights = AutoModel.from_pretrained(str(encoder_dir)).embeddings.word_embeddings.weight.detach().numpy()
    n, dim = len(store), weights.shape[1]
    out_dir.mkdir(parents=True, exist_ok=True)
    emb = np.memmap(out_dir / EMBEDDINGS_NAME, dtype=np.float32, mode="w+", shape=(n, dim))
    for start in range(0, n, chunk):
        texts = [spec.passage_prefix + t for t in store.iter_texts(start, min(n, start + chunk))]
        ids = tok(texts, max_length=max_length, truncation=True)["input_ids"]
        indptr = np.cumsum([0] + [len(x) for x in ids])
        counts = sp.csr_matrix(
            (np.ones(indptr[-1], np.float32), np.concatenate(ids), indptr), shape=(len(ids), len(weights))
        )
        vectors = counts @ weights
        emb[start : start + len(ids)] = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    emb.flush()
    sample = list(store.iter_texts(0, 64))
    torch.set_num_threads(2)
    real = TextEncoder(spec).encode(sample, is_query=False)
    gap = float(np.abs(real - emb[:64]).max())
    assert gap < 1e-4, f"direct embeddings differ from the encoder's by {gap}"
    key = progress_key(spec, file_fingerprint(store.path), model_fingerprint(encoder_dir), n, dim)
    record_progress(out_dir, key, n)
    print(f"# embeddings {n} x {dim} written directly (max gap to the real encoder on 64 rows: {gap:.1e})", flush=True)


def build_index_dir(corpus: Path, index: Path, kind: str, encoder: Path, emb_dir: Path, args) -> float:
    """Build (once) a BM25 or dense index; dense ones start from the shared embedding memmap (hard links)."""
    from rlinf_ext.retrieval.build import build_index
    from rlinf_ext.retrieval.config import BuildConfig
    from rlinf_ext.retrieval.dense import EMBEDDINGS_NAME, PROGRESS_NAME

    if (index / "index_meta.json").exists():
        return 0.0
    t0 = time.perf_counter()
    if kind != "bm25":
        index.mkdir(parents=True, exist_ok=True)
        for name in (EMBEDDINGS_NAME, PROGRESS_NAME):
            (index / name).unlink(missing_ok=True)
            os.link(emb_dir / name, index / name)
    cfg = BuildConfig(
        corpus=str(corpus),
        out=str(index),
        retriever="bm25" if kind == "bm25" else "e5",
        model=None if kind == "bm25" else str(encoder),
        faiss_type=kind,
        max_length=args.max_length,
        device="cpu",
        audit_sample=args.audit_queries,
        audit_k=args.k,
        threads=args.threads,
    )
    build_index(cfg)
    return time.perf_counter() - t0


def warm_page_cache(index: Path) -> None:
    """Read every file of the index once, so start-up is measured with the page cache warm."""
    for path in index.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(16 << 20):
                    pass


async def _post(session, url, queries, topk):
    t0 = time.perf_counter()
    async with session.post(f"{url}/retrieve", json={"queries": queries, "topk": topk, "return_scores": True}) as r:
        r.raise_for_status()
        body = await r.json()
    return time.perf_counter() - t0, body["result"]


async def run_single_query_clients(url: str, queries: list[str], clients: int, topk: int):
    """``clients`` workers share the query list, each sending one query per request, back to back."""
    import aiohttp

    results: list = [None] * len(queries)
    latencies: list[float] = []
    next_i = iter(range(len(queries)))
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=1200)) as s:

        async def worker():
            for i in next_i:
                dt, res = await _post(s, url, [queries[i]], topk)
                latencies.append(dt)
                results[i] = res[0]

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(clients)])
        wall = time.perf_counter() - t0
    return wall, latencies, results


def _ids(results, k: int) -> np.ndarray:
    out = np.full((len(results), k), -1, dtype=np.int64)
    for i, docs in enumerate(results):
        ids = [int(d["document"]["id"]) for d in docs][:k]
        out[i, : len(ids)] = ids
    return out


def measure(
    index: Path,
    corpus: Path,
    queries: list[str],
    args,
    *,
    in_ram: bool = False,
    no_batching: bool = False,
    src: str | None = None,
) -> dict:
    """Start the server over ``index`` (from ``src`` when given), time its start-up and a 64-client load."""
    import httpx

    from rlinf_ext.retrieval.launch import RetrievalServerProcess
    from rlinf_ext.retrieval.memory import process_memory

    warm_page_cache(index)
    env = {"OMP_NUM_THREADS": str(args.threads)}
    if src:
        env["PYTHONPATH"] = src
    t0 = time.perf_counter()
    server = RetrievalServerProcess(
        index,
        corpus,
        no_batching=no_batching,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        threads=None if src else args.threads,
        in_ram=in_ram,
        env=env,
        startup_timeout_s=1800,
    )
    with server as url:
        ready = process_memory(server.pid)
        open_s = httpx.get(f"{url}/health", timeout=60).json().get("searcher_open_s")  # None: an older server
        httpx.post(f"{url}/retrieve", json={"queries": [queries[0]], "topk": args.k}, timeout=600).raise_for_status()
        startup = time.perf_counter() - t0
        first = process_memory(server.pid)
        wall, latencies, results = asyncio.run(run_single_query_clients(url, queries, args.clients, args.k))
        warm = process_memory(server.pid)
    return {
        "startup_s": startup,
        "open_s": open_s,
        "memory_ready": ready,
        "memory_first_answer": first,
        "memory_warm": warm,
        "qps": len(queries) / wall,
        "p50_ms": 1e3 * float(np.percentile(latencies, 50)),
        "p99_ms": 1e3 * float(np.percentile(latencies, 99)),
        "ids": _ids(results, args.k),
        "scores": [[d["score"] for d in r] for r in results],
    }


def index_size_mb(index: Path) -> float:
    return sum(p.stat().st_size for p in index.rglob("*") if p.is_file() and "jsonl" not in p.name) / 2**20


def _mem(m: dict) -> str:
    return f"{m['rss_mb']:.0f} ({m['anon_mb']:.0f}/{m['file_mb']:.0f})"


def compare(rows: list[dict], k: int) -> None:
    """Recall vs Flat and throughput ratios, in place: dense types vs Flat (memory-mapped), in-RAM Flat vs
    memory-mapped Flat (ratio mapped / in-RAM), BM25 vs the baseline checkout."""
    from rlinf_ext.retrieval.audit import recall_at_k

    flat = next((r for r in rows if r["kind"] == "flat" and r["mode"] == "mmap"), None)
    bm25 = next((r for r in rows if r["kind"] == "bm25" and r["mode"] == "mmap"), None)
    for r in rows:
        if r["kind"] != "bm25" and flat is not None:
            r["recall_vs_flat"] = recall_at_k(r["ids"], flat["ids"], k)
            r["qps_ratio"] = r["qps"] / flat["qps"]
            r["ratio_of"] = "vs Flat mmap"
        if r["kind"] == "flat" and r["mode"] == "in-ram" and flat is not None:
            r["qps_ratio"] = flat["qps"] / r["qps"]
            r["ratio_of"] = "mmap / in-RAM"
            r["identical_to_mmap"] = bool(np.array_equal(r["ids"], flat["ids"]))
        if r["kind"] == "bm25" and r["mode"] == "baseline" and bm25 is not None:
            bm25["qps_ratio"] = bm25["qps"] / r["qps"]
            bm25["ratio_of"] = "vs baseline"
            bm25["identical_to_baseline"] = bool(np.array_equal(r["ids"], bm25["ids"])) and all(
                np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(r["scores"], bm25["scores"])
            )


def print_rows(size: int, rows: list[dict], k: int) -> None:
    print(f"\n== {size:,} passages | RSS MB as total (own/mapped files) | {rows[0]['clients']} single-query clients")
    print(
        f"{'index':<11}{'mode':<10}{'index MB':>9}{'start s':>9}{'open s':>8}{'RSS ready':>18}{'RSS 1st answer':>19}"
        f"{'RSS warm':>18}{'q/s':>8}{'p50 ms':>8}{'p99 ms':>8}{f'R@{k}':>8}{'ratio':>7}  note"
    )
    for r in rows:
        recall = f"{r['recall_vs_flat']:.4f}" if "recall_vs_flat" in r else "-"
        ratio = f"{r['qps_ratio']:.2f}" if "qps_ratio" in r else "-"
        note = r.get("ratio_of", "")
        for flag in ("identical_to_mmap", "identical_to_baseline"):
            if flag in r:
                note += f"; {flag.replace('_', ' ')}: {r[flag]}"
        if r.get("search_params"):
            note += f"; {r['search_params']}"
        open_s = "-" if r["open_s"] is None else f"{r['open_s']:.2f}"
        print(
            f"{r['kind']:<11}{r['mode']:<10}{r['index_mb']:>9.0f}{r['startup_s']:>9.2f}{open_s:>8}"
            f"{_mem(r['memory_ready']):>18}{_mem(r['memory_first_answer']):>19}{_mem(r['memory_warm']):>18}"
            f"{r['qps']:>8.1f}{r['p50_ms']:>8.1f}{r['p99_ms']:>8.1f}{recall:>8}{ratio:>7}  {note}"
        )
    sys.stdout.flush()


def bench_size(size: int, kinds: list[str], words: list[str], encoder: Path, work: Path, args) -> list[dict]:
    from rlinf_ext.retrieval.audit import sample_queries
    from rlinf_ext.retrieval.corpus import CorpusStore
    from rlinf_ext.retrieval.dense import PROGRESS_NAME
    from rlinf_ext.retrieval.metadata import IndexMetadata

    corpus = work / f"corpus_topics_{size}.jsonl"
    t0 = time.perf_counter()
    synthetic_corpus(corpus, size, words)
    print(f"# corpus {size}: {corpus.stat().st_size / 2**20:.0f} MB ({time.perf_counter() - t0:.0f}s)", flush=True)
    store = CorpusStore.open(corpus, cache_dir=work)
    queries = sample_queries(store, args.queries, seed=1)
    emb_dir = work / f"embeddings_{encoder.name}_{size}"
    if any(k in DENSE_TYPES for k in kinds) and not (emb_dir / PROGRESS_NAME).exists():
        write_embeddings(store, emb_dir, encoder, args.max_length)
    rows = []
    for kind in kinds:
        index = work / (f"index_bm25_topics_{size}" if kind == "bm25" else f"index_{kind}_{encoder.name}_{size}")
        build_s = build_index_dir(corpus, index, kind, encoder, emb_dir, args)
        meta = IndexMetadata.load(index)
        print(f"# {kind} index {size}: {meta.faiss_type or 'bm25'}, built in {build_s:.0f}s (0 = cached)", flush=True)
        modes = [("mmap", False, None)]
        if kind == "flat" and args.in_ram_too:
            modes.append(("in-ram", True, None))
        if kind == "bm25" and args.baseline_src:
            modes.append(("baseline", False, args.baseline_src))
        for mode, in_ram, src in modes:
            r = measure(index, corpus, queries, args, in_ram=in_ram, src=src)
            rows.append(
                {
                    "size": size,
                    "kind": kind,
                    "mode": mode,
                    "faiss_type": meta.faiss_type,
                    "search_params": meta.search_params,
                    "index_mb": index_size_mb(index),
                    "clients": args.clients,
                    "build_s": build_s,
                    **r,
                }
            )
            print(f"#   {mode}: {r['qps']:.1f} q/s, start-up {r['startup_s']:.2f}s", flush=True)
    store.close()
    if args.drop_embeddings:
        shutil.rmtree(emb_dir, ignore_errors=True)
    compare(rows, args.k)
    print_rows(size, rows, args.k)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="250000,500000,1000000,2000000", help="Comma list of corpus sizes (passages).")
    p.add_argument(
        "--types",
        default="bm25,flat,flat-fp16,approx",
        help=f"Comma list: bm25 and dense presets ({', '.join(DENSE_TYPES)}); flat is the recall reference.",
    )
    p.add_argument("--work-dir", default="/tmp/retrieval_bench", help="Corpora and indexes are cached here.")
    p.add_argument("--encoder-hidden", type=int, default=768, help="Width of the dense encoder (e5-base: 768).")
    p.add_argument("--max-length", type=int, default=64, help="Tokens per passage / query.")
    p.add_argument("--queries", type=int, default=1024, help="Queries sent by the single-query clients.")
    p.add_argument("--audit-queries", type=int, default=500, help="Build-time audit sample (approx, flat-fp16).")
    p.add_argument("--k", type=int, default=3, help="topk of every request; recall@k against Flat.")
    p.add_argument("--clients", type=int, default=64, help="Concurrent single-query clients.")
    p.add_argument("--in-ram-too", action="store_true", help="Also serve Flat read into RAM (--in-ram).")
    p.add_argument(
        "--baseline-src",
        default=None,
        help="Directory holding an older rlinf_ext checkout: BM25 is also served from it (PYTHONPATH).",
    )
    p.add_argument("--drop-embeddings", action="store_true", help="Delete a size's embedding memmap when done.")
    p.add_argument("--max-batch-size", type=int, default=512)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=2, help="OMP / torch / numba threads of the server.")
    p.add_argument("--json-out", default=None, help="Also write the figures as JSON here.")
    args = p.parse_args(argv)

    kinds = [k for k in args.types.split(",") if k]
    unknown = set(kinds) - set(DENSE_TYPES) - {"bm25"}
    if unknown:
        p.error(f"unknown --types {sorted(unknown)}; choose from bm25, {', '.join(DENSE_TYPES)}")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    base = default_encoder(work)
    words = encoder_words(base)
    encoder = bow_encoder(base, work, args.encoder_hidden)
    all_rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        all_rows += bench_size(size, kinds, words, encoder, work, args)
        if args.json_out:
            rows = [{k: v for k, v in r.items() if k not in ("ids", "scores")} for r in all_rows]
            Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
