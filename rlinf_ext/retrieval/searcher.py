"""What the server needs from an index: ``search(queries, k) -> (scores, rows)``, plus opening one by metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from .metadata import IndexMetadata


class Searcher(Protocol):
    retriever: str  # bm25 | e5 | bge
    index_type: str  # "bm25" or the faiss factory string
    passages: int

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` per query: ``scores`` float32 (n, k) best first, ``rows`` int64 (n, k) corpus row numbers.

        Must give each query the same answer whatever other queries share the call (batching relies on it).
        """
        ...


def topk_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first; equal scores ordered by lower index (deterministic)."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k < len(scores):
        # Everything strictly above the k-th value is in; fill the rest with the lowest-index ties.
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        above = np.flatnonzero(scores > kth)
        ties = np.flatnonzero(scores == kth)[: k - len(above)]
        candidates = np.concatenate([above, ties])
    else:
        candidates = np.arange(len(scores))
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order].astype(np.int64)


def open_searcher(index_dir: str | Path, *, model: str | None = None, device: str = "cpu",
                  gpus: str | None = None, query_batch_size: int = 256,
                  threads: int | None = None) -> tuple[Searcher, IndexMetadata]:
    """Open the index in ``index_dir`` by its metadata (BM25 or dense)."""
    meta = IndexMetadata.load(index_dir)
    if meta.retriever == "bm25":
        from .bm25 import BM25Searcher

        return BM25Searcher.load(index_dir, meta), meta
    from .dense import DenseSearcher

    return DenseSearcher.load(index_dir, meta, model=model, device=device, gpus=gpus,
                              query_batch_size=query_batch_size, threads=threads), meta
