"""Open an index directory by its metadata: BM25 or dense (faiss)."""

from __future__ import annotations

from pathlib import Path

from .bm25 import BM25Searcher
from .metadata import IndexMetadata
from .searcher import Searcher


def open_searcher(
    index_dir: str | Path,
    *,
    model: str | None = None,
    device: str = "cpu",
    gpus: str | None = None,
    query_batch_size: int = 256,
    threads: int | None = None,
    in_ram: bool = False,
    search_params: dict | None = None,
) -> tuple[Searcher, IndexMetadata]:
    """Open the index in ``index_dir`` by its metadata (BM25 or dense), memory-mapped unless ``in_ram``.

    ``search_params`` (faiss names, e.g. ``{"nprobe": 64}``) update the ones recorded in a dense index's metadata.
    """
    meta = IndexMetadata.load(index_dir)
    if meta.retriever == "bm25":
        if search_params:
            raise ValueError(
                f"search parameters {sorted(search_params)} apply to dense (faiss) indexes; {index_dir} is a BM25 index"
            )
        return BM25Searcher.load(index_dir, meta, in_ram=in_ram, threads=threads), meta
    from .dense import DenseSearcher  # lazy: torch and the encoder, which a BM25 server starts without

    return DenseSearcher.load(
        index_dir,
        meta,
        model=model,
        device=device,
        gpus=gpus,
        query_batch_size=query_batch_size,
        threads=threads,
        in_ram=in_ram,
        search_params=search_params,
    ), meta
