"""What the server needs from an index: ``search(queries, k) -> (scores, rows)``, and the shared top-k helper.

Opening an index by its metadata lives in ``retrieval/open.py`` (it imports the concrete searchers, which import
this module: keeping it here would be an import cycle)."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Searcher(Protocol):
    retriever: str  # bm25 | e5 | bge
    index_type: str  # "bm25" or the faiss factory string
    passages: int
    memory_mapped: bool  # the index is read through mmap (page cache), not copied into the process
    search_params: dict  # faiss search parameters in effect (e.g. {"nprobe": 32}); {} for BM25 and exact types

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` per query: ``scores`` float32 (n, k) best first, ``rows`` int64 (n, k) corpus row numbers
        (-1 where an approximate index found fewer than ``k``).

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
