"""`build-index`: dispatch to the BM25 or the dense builder."""

from __future__ import annotations

from pathlib import Path

from .bm25 import build_bm25_index
from .config import BuildConfig
from .corpus import CorpusStore
from .dense import AuditSpec, build_dense_index
from .encoder import EncoderSpec
from .hub import resolve_model_dir
from .metadata import IndexMetadata


def build_index(cfg: BuildConfig, on_chunk=None) -> IndexMetadata:
    """Build the index described by ``cfg``; ``on_chunk(rows_done)`` is called after each dense chunk."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    store = CorpusStore.open(cfg.corpus, cache_dir=out, show_progress=True)
    try:
        if cfg.retriever == "bm25":
            return build_bm25_index(store, out)
        if not cfg.model:
            raise ValueError(
                f"--retriever {cfg.retriever} is dense and needs --model (an encoder directory in "
                "Hugging Face format such as $WORK/models/e5-base-v2, or a hub id such as "
                "intfloat/e5-base-v2)"
            )
        # a hub id becomes its local snapshot here: the fingerprint and the metadata need a directory
        model_dir = resolve_model_dir(cfg.model)
        spec = EncoderSpec.for_retriever(cfg.retriever, str(model_dir), max_length=cfg.max_length, pooling=cfg.pooling)
        audit = AuditSpec(sample=cfg.audit_sample, k=cfg.audit_k, target=cfg.recall_target)
        return build_dense_index(
            store,
            out,
            spec,
            faiss_type=cfg.faiss_type,
            batch_size=cfg.batch_size,
            device=cfg.device,
            gpus=cfg.gpus,
            keep_embeddings=cfg.keep_embeddings,
            threads=cfg.threads,
            audit=audit,
            on_chunk=on_chunk,
        )
    finally:
        store.close()
