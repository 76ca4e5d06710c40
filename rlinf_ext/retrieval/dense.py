"""Dense (faiss) index: resumable build from an embedding memmap, and the searcher the server uses.

Build: passages are encoded in chunks into ``embeddings.f32`` (a float32 memmap, N x dim); after every
chunk is flushed, ``build_progress.json`` records how many rows are done, so an interrupted build resumes
from there. Then the faiss index (``index_factory`` string, inner product) is trained if needed, filled
and written as ``faiss.index``; the metadata file is written last (its presence marks a finished index).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import faiss
import numpy as np

from .corpus import CorpusStore, file_fingerprint
from .encoder import EncoderSpec, TextEncoder
from .metadata import IndexMetadata, IndexMismatchError, model_fingerprint

EMBEDDINGS_NAME = "embeddings.f32"
PROGRESS_NAME = "build_progress.json"
FAISS_NAME = "faiss.index"
_TRAIN_SAMPLE = 200_000


def _resolve_device(device: str) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _progress_key(spec: EncoderSpec, corpus_checksum: str, model_checksum: str, passages: int, dim: int) -> dict:
    return {"corpus_checksum": corpus_checksum, "model_checksum": model_checksum, "passages": passages,
            "dim": dim, "pooling": spec.pooling, "passage_prefix": spec.passage_prefix,
            "max_length": spec.max_length}


def encode_corpus(store: CorpusStore, out_dir: Path, encoder: TextEncoder, *, batch_size: int,
                  corpus_checksum: str, model_checksum: str, chunk_rows: int | None = None, on_chunk=None,
                  show_progress: bool = True) -> np.memmap:
    """Fill (or resume filling) the embedding memmap; returns it complete."""
    n, dim = len(store), encoder.dim
    emb_path, progress_path = out_dir / EMBEDDINGS_NAME, out_dir / PROGRESS_NAME
    key = _progress_key(encoder.spec, corpus_checksum, model_checksum, n, dim)
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
        tmp = progress_path.with_name(PROGRESS_NAME + ".tmp")
        tmp.write_text(json.dumps({"key": key, "rows_done": stop}))
        os.replace(tmp, progress_path)  # recorded only after the rows are on disk
        if bar is not None:
            bar.update(stop - start)
        if on_chunk is not None:
            on_chunk(stop)
    if bar is not None:
        bar.close()
    return emb


def new_faiss_index(dim: int, faiss_type: str) -> faiss.Index:
    """``index_factory(dim, faiss_type, inner product)`` or a ValueError naming valid strings."""
    try:
        return faiss.index_factory(dim, faiss_type, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        first_line = str(e).strip().splitlines()[-1] if str(e).strip() else ""
        raise ValueError(f"faiss cannot build '{faiss_type}' for dim {dim} ({first_line}). Use e.g. Flat, "
                         "HNSW64, IVF4096,Flat or IVF4096,PQ64 (PQ needs dim divisible by the PQ size).") from e


def make_faiss_index(emb: np.ndarray, faiss_type: str, show_progress: bool = True) -> faiss.Index:
    """A new index of ``faiss_type``, trained on a sample if the type needs it, filled with ``emb``."""
    n, dim = emb.shape
    index = new_faiss_index(dim, faiss_type)
    if not index.is_trained:
        rng = np.random.default_rng(0)
        sample = np.sort(rng.choice(n, size=min(n, _TRAIN_SAMPLE), replace=False))
        index.train(np.ascontiguousarray(emb[sample]))
    step = 100_000
    iterator = range(0, n, step)
    if show_progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, desc=f"adding to faiss {faiss_type}", unit="chunk")
    for start in iterator:
        index.add(np.ascontiguousarray(emb[start:start + step]))
    return index


def build_dense_index(store: CorpusStore, out_dir: str | Path, spec: EncoderSpec, *, faiss_type: str = "Flat",
                      batch_size: int = 64, device: str = "auto", gpus: str | None = None,
                      keep_embeddings: bool = False, chunk_rows: int | None = None, on_chunk=None,
                      threads: int | None = None, show_progress: bool = True) -> IndexMetadata:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "index_meta.json").unlink(missing_ok=True)  # unfinished until the end
    device = _resolve_device(device)
    if gpus and device == "cpu":
        raise ValueError("--gpus was given but no CUDA device is visible to torch")
    encoder = TextEncoder(spec, device=device, threads=threads)
    new_faiss_index(encoder.dim, faiss_type)  # a bad factory string fails now, not after hours of encoding
    corpus_checksum = file_fingerprint(store.path)
    model_checksum = model_fingerprint(spec.model_path)
    emb = encode_corpus(store, out_dir, encoder, batch_size=batch_size, corpus_checksum=corpus_checksum,
                        model_checksum=model_checksum, chunk_rows=chunk_rows, on_chunk=on_chunk,
                        show_progress=show_progress)
    index = make_faiss_index(emb, faiss_type, show_progress=show_progress)
    tmp = out_dir / (FAISS_NAME + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, out_dir / FAISS_NAME)
    meta = IndexMetadata(
        retriever="e5" if spec.query_prefix == "query: " else "bge", corpus_path=str(store.path.resolve()),
        corpus_size=store.path.stat().st_size, corpus_checksum=corpus_checksum, passages=len(store),
        model=str(Path(spec.model_path).resolve()), model_checksum=model_checksum, dim=encoder.dim,
        pooling=spec.pooling, query_prefix=spec.query_prefix, passage_prefix=spec.passage_prefix,
        max_length=spec.max_length, faiss_type=faiss_type,
    )
    meta.save(out_dir)
    del emb
    if not keep_embeddings:
        (out_dir / EMBEDDINGS_NAME).unlink(missing_ok=True)
        (out_dir / PROGRESS_NAME).unlink(missing_ok=True)
    return meta


def _to_gpus(index: faiss.Index, gpus: str) -> faiss.Index:
    """Shard the index over the chosen GPUs in fp16 (faiss-GPU), or explain why that is not possible."""
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        raise ValueError("--gpus asks for faiss-GPU but this faiss has no GPU support or sees no GPU (faiss-cpu, "
                         "a base requirement, overwrites faiss-gpu when installed after it); fix: "
                         "`bash scripts/install.sh --gpu --faiss-gpu` (removes faiss-cpu, then installs "
                         "faiss-gpu-cu12), or drop --gpus")
    if isinstance(index, faiss.IndexHNSW) or "HNSW" in type(index).__name__:
        raise ValueError("HNSW indexes cannot run on faiss-GPU; serve them on CPU (drop --gpus)")
    options = faiss.GpuMultipleClonerOptions()
    options.shard = True
    options.useFloat16 = True
    if gpus == "all":
        return faiss.index_cpu_to_all_gpus(index, co=options)
    ids = [int(g) for g in gpus.split(",") if g.strip()]
    resources = [faiss.StandardGpuResources() for _ in ids]
    return faiss.index_cpu_to_gpu_multiple_py(resources, index, co=options, gpus=ids)


# faiss 1.15 sets `distance_compute_blas_threshold` to 128000, and its exhaustive (Flat) search then scans the
# whole index once per query for batches below ~threshold / dim queries (measured on 1M x 768, 3 GB: 64 queries
# took 7.3 s, 16 took 1.9 s, 256 took 1.7 s). With the threshold at faiss's old default of 20, 64 queries are one
# BLAS product over the index (0.61 s) and one query costs the same as before (0.27 s vs 0.30 s). Cross-request
# batching only pays when a batch reads the index once, so the server lowers it.
FLAT_BLAS_THRESHOLD = 20


def use_blas_for_batches(threshold: int = FLAT_BLAS_THRESHOLD) -> None:
    """Set faiss's `distance_compute_blas_threshold` (a process-wide setting) for batched Flat searches."""
    faiss.cvar.distance_compute_blas_threshold = int(threshold)


class DenseSearcher:
    def __init__(self, encoder: TextEncoder, index: faiss.Index, meta: IndexMetadata, query_batch_size: int) -> None:
        self.encoder = encoder
        self.index = index
        self.retriever = meta.retriever
        self.index_type = meta.faiss_type or "Flat"
        self.passages = meta.passages
        self.query_batch_size = query_batch_size

    @classmethod
    def load(cls, index_dir: str | Path, meta: IndexMetadata, *, model: str | None = None, device: str = "cpu",
             gpus: str | None = None, query_batch_size: int = 256, threads: int | None = None) -> DenseSearcher:
        model_path = model or meta.model
        if not model_path or not Path(model_path).is_dir():
            source = "--model" if model else "the index metadata"
            raise IndexMismatchError(f"encoder directory {model_path!r} (from {source}) not found; pass --model "
                                     "pointing to the encoder the index was built with")
        spec = EncoderSpec(model_path=str(model_path), pooling=meta.pooling or "mean",
                           query_prefix=meta.query_prefix, passage_prefix=meta.passage_prefix,
                           max_length=meta.max_length or 256)
        encoder = TextEncoder(spec, device=device, threads=threads)
        if encoder.dim != meta.dim:
            raise IndexMismatchError(f"encoder {model_path} gives {encoder.dim}-d vectors but the index in "
                                     f"{index_dir} holds {meta.dim}-d ones; pass the encoder it was built with")
        path = str(Path(index_dir) / FAISS_NAME)
        try:  # memory-map when the index type allows it: fast start, pages shared with the OS cache
            index = faiss.read_index(path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        except RuntimeError:
            index = faiss.read_index(path)
        if gpus:
            index = _to_gpus(index, gpus)
        use_blas_for_batches()
        return cls(encoder, index, meta, query_batch_size)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.passages)
        vectors = self.encoder.encode(queries, is_query=True, batch_size=self.query_batch_size)
        scores, rows = self.index.search(vectors, k)
        return scores.astype(np.float32), rows.astype(np.int64)
