"""Dense (faiss) index: resumable build from an embedding memmap, and the searcher the server uses.

Build: passages are encoded in chunks into ``embeddings.f32`` (a float32 memmap, N x dim); after every
chunk is flushed, ``build_progress.json`` records how many rows are done, so an interrupted build resumes
from there. Then the faiss index (a preset or an ``index_factory`` string, inner product) is trained if
needed and filled; for an approximate type the search parameters (nprobe, efSearch, k_factor_rf) are chosen on
sampled queries against exact search over the embeddings (audit.py) and recorded with the figures. It is
written as ``faiss.index``; the metadata file is written last (its presence marks a finished index).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import torch

from .audit import (
    AUDIT_RECALL,
    audit_record,
    choose_search_params,
    exact_search,
    recall_at_k,
    sample_queries,
    time_batches,
)
from .config import parse_gpu_ids
from .corpus import CorpusStore, file_fingerprint
from .encoder import EncoderSpec, TextEncoder
from .faiss_index import (
    EXACT_TYPE,
    FAISS_NAME,
    apply_search_params,
    new_faiss_index,
    read_faiss_index,
    resolve_faiss_type,
    to_gpus,
    tunable_params,
    write_faiss_index,
)
from .hub import EncoderNotFoundError, resolve_model_dir
from .metadata import METADATA_NAME, IndexMetadata, IndexMismatchError, model_fingerprint

EMBEDDINGS_NAME = "embeddings.f32"
PROGRESS_NAME = "build_progress.json"
_TRAIN_SAMPLE = 200_000


def resolve_device(device: str) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def progress_key(spec: EncoderSpec, corpus_checksum: str, model_checksum: str, passages: int, dim: int) -> dict:
    """What an embedding memmap was made from; a resumed build continues it only when this is unchanged."""
    return {
        "corpus_checksum": corpus_checksum,
        "model_checksum": model_checksum,
        "passages": passages,
        "dim": dim,
        "pooling": spec.pooling,
        "passage_prefix": spec.passage_prefix,
        "max_length": spec.max_length,
    }


def record_progress(out_dir: Path, key: dict, rows_done: int) -> None:
    """Record that the first ``rows_done`` rows of the embedding memmap in ``out_dir`` are written (atomically)."""
    tmp = out_dir / (PROGRESS_NAME + ".tmp")
    tmp.write_text(json.dumps({"key": key, "rows_done": rows_done}))
    os.replace(tmp, out_dir / PROGRESS_NAME)


def encode_corpus(
    store: CorpusStore,
    out_dir: Path,
    encoder: TextEncoder,
    *,
    batch_size: int,
    corpus_checksum: str,
    model_checksum: str,
    chunk_rows: int | None = None,
    on_chunk=None,
    show_progress: bool = True,
) -> np.memmap:
    """Fill (or resume filling) the embedding memmap; returns it complete."""
    n, dim = len(store), encoder.dim
    emb_path, progress_path = out_dir / EMBEDDINGS_NAME, out_dir / PROGRESS_NAME
    key = progress_key(encoder.spec, corpus_checksum, model_checksum, n, dim)
    done = 0
    if progress_path.exists() and emb_path.exists():
        saved = json.loads(progress_path.read_text())
        if saved.get("key") == key and emb_path.stat().st_size == n * dim * 4:
            done = int(saved["rows_done"])
        else:
            print(f"{progress_path}: an earlier build used another corpus/encoder; starting over", flush=True)
    mode = "r+" if done > 0 else "w+"
    emb = np.memmap(emb_path, dtype=np.float32, mode=mode, shape=(n, dim))
    chunk_rows = chunk_rows or max(batch_size * 16, 1024)  # rows between progress checkpoints
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=n, initial=done, desc="encoding passages", unit="psg")
    for start in range(done, n, chunk_rows):
        stop = min(n, start + chunk_rows)
        emb[start:stop] = encoder.encode(list(store.iter_texts(start, stop)), is_query=False, batch_size=batch_size)
        emb.flush()
        record_progress(out_dir, key, stop)  # recorded only after the rows are on disk
        if bar is not None:
            bar.update(stop - start)
        if on_chunk is not None:
            on_chunk(stop)
    if bar is not None:
        bar.close()
    return emb


def _train_sample_size(index: faiss.Index, n: int) -> int:
    """Training rows: 200k, or 50 per IVF list when that is more (faiss wants >= 39 per list)."""
    ivf = faiss.try_extract_index_ivf(index)
    return min(n, max(_TRAIN_SAMPLE, 50 * ivf.nlist if ivf is not None else 0))


def make_faiss_index(emb: np.ndarray, faiss_type: str, show_progress: bool = True) -> faiss.Index:
    """A new index of ``faiss_type``, trained on a sample if the type needs it, filled with ``emb``."""
    n, dim = emb.shape
    index = new_faiss_index(dim, faiss_type)
    if not index.is_trained:
        rng = np.random.default_rng(0)
        sample = np.sort(rng.choice(n, size=_train_sample_size(index, n), replace=False))
        index.train(np.ascontiguousarray(emb[sample]))
    step = 100_000
    iterator = range(0, n, step)
    if show_progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, desc=f"adding to faiss {faiss_type}", unit="chunk")
    for start in iterator:
        index.add(np.ascontiguousarray(emb[start : start + step]))
    return index


@dataclass(frozen=True)
class AuditSpec:
    """Build-time audit: ``sample`` queries (0 = none), recall@``k`` to reach, ``target`` recall."""

    sample: int = 0
    k: int = 3
    target: float = 0.99


def build_dense_index(
    store: CorpusStore,
    out_dir: str | Path,
    spec: EncoderSpec,
    *,
    faiss_type: str = "Flat",
    batch_size: int = 64,
    device: str = "auto",
    gpus: str | None = None,
    keep_embeddings: bool = False,
    chunk_rows: int | None = None,
    on_chunk=None,
    threads: int | None = None,
    audit: AuditSpec = AuditSpec(),
    show_progress: bool = True,
) -> IndexMetadata:
    """Encode (resumably), build, write, and for approximate types tune + audit on a query sample."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / METADATA_NAME).unlink(missing_ok=True)  # unfinished until the end
    device = resolve_device(device)
    if gpus and device == "cpu":
        raise ValueError("--gpus was given but no CUDA device is visible to torch")
    gpu_ids = parse_gpu_ids(gpus, torch.cuda.device_count()) if gpus else None
    model_checksum = model_fingerprint(spec.model_path)  # a directory (build.py resolves a hub id first)
    encoder = TextEncoder(spec, device=device, threads=threads, gpus=gpu_ids)
    faiss_type = resolve_faiss_type(faiss_type, len(store), encoder.dim)
    new_faiss_index(encoder.dim, faiss_type)  # a bad factory string fails now, not after hours of encoding
    corpus_checksum = file_fingerprint(store.path)
    emb = encode_corpus(
        store,
        out_dir,
        encoder,
        batch_size=batch_size,
        corpus_checksum=corpus_checksum,
        model_checksum=model_checksum,
        chunk_rows=chunk_rows,
        on_chunk=on_chunk,
        show_progress=show_progress,
    )
    index = make_faiss_index(emb, faiss_type, show_progress=show_progress)
    meta = IndexMetadata(
        retriever="e5" if spec.query_prefix == "query: " else "bge",
        corpus_path=str(store.path.resolve()),
        corpus_size=store.path.stat().st_size,
        corpus_checksum=corpus_checksum,
        passages=len(store),
        model=str(Path(spec.model_path).resolve()),
        model_checksum=model_checksum,
        dim=encoder.dim,
        pooling=spec.pooling,
        query_prefix=spec.query_prefix,
        passage_prefix=spec.passage_prefix,
        max_length=spec.max_length,
        faiss_type=faiss_type,
    )
    if faiss_type != EXACT_TYPE and audit.sample > 0:
        meta.search_params, meta.audit = tune_and_audit(index, emb, encoder, store, audit)
    elif tunable_params(index):
        print(
            f"warning: {faiss_type} is approximate and no audit ran (--audit-sample 0), so its search parameters "
            "stay at faiss's defaults (nprobe 1, efSearch 16); pass --nprobe / --ef-search to serve-retriever",
            flush=True,
        )
    meta.faiss_checksum = write_faiss_index(index, out_dir / FAISS_NAME)
    meta.save(out_dir)
    del emb
    if not keep_embeddings:
        (out_dir / EMBEDDINGS_NAME).unlink(missing_ok=True)
        (out_dir / PROGRESS_NAME).unlink(missing_ok=True)
    return meta


def tune_and_audit(
    index: faiss.Index, emb: np.ndarray, encoder: TextEncoder, store: CorpusStore, spec: AuditSpec
) -> tuple[dict, dict]:
    """Choose the search parameters reaching ``spec.target`` recall@k on sampled queries; returns them + the audit."""
    queries = sample_queries(store, spec.sample)
    vectors = encoder.encode(queries, is_query=True, batch_size=64)
    _, truth = exact_search(emb, vectors, spec.k)
    params, sweep = choose_search_params(index, vectors, truth, spec.k, spec.target)
    _, rows = index.search(vectors, spec.k)
    record = audit_record(
        k=spec.k,
        queries=f"{len(queries)} sampled from the corpus",
        recall=recall_at_k(rows, truth, spec.k),
        reference="exact search over the build's embeddings",
        params=params,
        latency=time_batches(index.search, vectors, spec.k, [1, 16, 64]),
        sweep=sweep,
    )
    print(
        f"audit: recall@{spec.k} {record[AUDIT_RECALL]:.4f} with {params or 'defaults'} (target {spec.target})",
        flush=True,
    )
    return params, record


# faiss 1.15 sets `distance_compute_blas_threshold` to 128000, and its exhaustive (Flat) search then scans the
# whole index once per query for batches below ~threshold / dim queries (measured on 1M x 768, 3 GB: 64 queries
# took 7.3 s, 16 took 1.9 s, 256 took 1.7 s). With the threshold at faiss's old default of 20, 64 queries are one
# BLAS product over the index (0.61 s) and one query costs the same as before (0.27 s vs 0.30 s). Cross-request
# batching only pays when a batch reads the index once, so the server lowers it.
FLAT_BLAS_THRESHOLD = 20


def use_blas_for_batches(threshold: int = FLAT_BLAS_THRESHOLD) -> None:
    """Set faiss's `distance_compute_blas_threshold` (a process-wide setting) for batched Flat searches."""
    faiss.cvar.distance_compute_blas_threshold = int(threshold)


def load_encoder(
    meta: IndexMetadata,
    index_dir: str | Path,
    *,
    model: str | None = None,
    device: str = "cpu",
    threads: int | None = None,
) -> TextEncoder:
    """The query encoder of a dense index (``model`` overrides the recorded one), checked against its width."""
    model_path = model or meta.model
    source = "--model" if model else "the index metadata"
    try:
        if not model_path:
            raise EncoderNotFoundError("no encoder recorded")
        model_dir = resolve_model_dir(model_path)
    except EncoderNotFoundError as e:
        raise IndexMismatchError(
            f"encoder {model_path!r} (from {source}) not found ({e}); pass --model "
            "pointing to the encoder the index was built with"
        ) from e
    spec = EncoderSpec(
        model_path=str(model_dir),
        pooling=meta.pooling or "mean",
        query_prefix=meta.query_prefix,
        passage_prefix=meta.passage_prefix,
        max_length=meta.max_length or 256,
    )
    encoder = TextEncoder(spec, device=device, threads=threads)
    if encoder.dim != meta.dim:
        raise IndexMismatchError(
            f"encoder {model_path} gives {encoder.dim}-d vectors but the index in "
            f"{index_dir} holds {meta.dim}-d ones; pass the encoder it was built with"
        )
    return encoder


def open_faiss_index(
    index_dir: str | Path,
    meta: IndexMetadata,
    *,
    in_ram: bool = False,
    gpus: str | None = None,
    search_params: dict | None = None,
) -> tuple[faiss.Index, bool, dict]:
    """Read ``faiss.index`` (memory-mapped unless ``in_ram``), put it on GPUs if asked, set its search parameters
    (the metadata's, updated by ``search_params``); returns ``(index, memory_mapped, params)``."""
    index, mapped = read_faiss_index(Path(index_dir) / FAISS_NAME, meta, in_ram=in_ram)
    if gpus:
        index = to_gpus(index, gpus)
    params = {**meta.search_params, **(search_params or {})}
    apply_search_params(index, params, meta.faiss_type or EXACT_TYPE, gpu=bool(gpus))
    use_blas_for_batches()
    return index, mapped, params


class DenseSearcher:
    def __init__(
        self,
        encoder: TextEncoder,
        index: faiss.Index,
        meta: IndexMetadata,
        query_batch_size: int,
        *,
        memory_mapped: bool = False,
        search_params: dict | None = None,
    ) -> None:
        self.encoder = encoder
        self.index = index
        self.retriever = meta.retriever
        self.index_type = meta.faiss_type or EXACT_TYPE
        self.passages = meta.passages
        self.query_batch_size = query_batch_size
        self.memory_mapped = memory_mapped
        self.search_params = dict(search_params or {})

    @classmethod
    def load(
        cls,
        index_dir: str | Path,
        meta: IndexMetadata,
        *,
        model: str | None = None,
        device: str = "cpu",
        gpus: str | None = None,
        query_batch_size: int = 256,
        threads: int | None = None,
        in_ram: bool = False,
        search_params: dict | None = None,
    ) -> DenseSearcher:
        encoder = load_encoder(meta, index_dir, model=model, device=device, threads=threads)
        index, mapped, params = open_faiss_index(index_dir, meta, in_ram=in_ram, gpus=gpus, search_params=search_params)
        return cls(encoder, index, meta, query_batch_size, memory_mapped=mapped, search_params=params)

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` of encoded queries; a row is -1 where an approximate index found fewer than ``k``."""
        scores, rows = self.index.search(vectors, min(k, self.passages))
        return scores.astype(np.float32), rows.astype(np.int64)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.search_vectors(self.encoder.encode(queries, is_query=True, batch_size=self.query_batch_size), k)
