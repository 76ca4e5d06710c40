"""Open an index directory by its metadata: BM25 or dense (faiss)."""

from __future__ import annotations

from pathlib import Path

from .bm25 import BM25Searcher
from .dense import DenseSearcher
from .metadata import IndexMetadata
from .searcher import Searcher


def open_searcher(index_dir: str | Path, *, model: str | None = None, device: str = "cpu",
                  gpus: str | None = None, query_batch_size: int = 256,
                  threads: int | None = None) -> tuple[Searcher, IndexMetadata]:
    """Open the index in ``index_dir`` by its metadata (BM25 or dense)."""
    meta = IndexMetadata.load(index_dir)
    if meta.retriever == "bm25":
        return BM25Searcher.load(index_dir, meta), meta
    return DenseSearcher.load(index_dir, meta, model=model, device=device, gpus=gpus,
                              query_batch_size=query_batch_size, threads=threads), meta
