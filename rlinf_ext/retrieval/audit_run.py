"""`rlinf-ext audit-index`: recall@k of a dense index against a Flat index of the same corpus and encoder,
search latency at several batch sizes, and the auditing process's memory (optionally stored in the metadata)."""

from __future__ import annotations

import json
from pathlib import Path

from .audit import audit_record, recall_at_k, sample_queries, time_batches
from .config import AuditConfig, search_params
from .corpus import CorpusStore
from .dense import DenseSearcher, open_faiss_index
from .faiss_index import EXACT_TYPE
from .memory import process_memory
from .metadata import IndexMetadata, IndexMismatchError


def read_queries(path: str | Path) -> list[str]:
    """One query per line, or (``.jsonl``) one JSON object per line with a ``question`` or ``query`` field."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"query file {path} not found")
    queries = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            row = json.loads(line)
            text = row.get("question", row.get("query")) if isinstance(row, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{n}: expected an object with a 'question' or 'query' string")
            line = text
        queries.append(line.strip())
    if not queries:
        raise ValueError(f"query file {path} holds no queries")
    return queries


def check_reference(meta: IndexMetadata, ref: IndexMetadata, index: str, reference: str) -> None:
    """The reference must be an exact (Flat) index of the same corpus, embedded by the same encoder."""
    problems = []
    if meta.retriever == "bm25" or ref.retriever == "bm25":
        problems.append("both must be dense (faiss) indexes")
    if ref.faiss_type != EXACT_TYPE:
        problems.append(f"the reference is '{ref.faiss_type}', not exact; build one with --faiss-type flat")
    if ref.corpus_checksum != meta.corpus_checksum or ref.passages != meta.passages:
        problems.append("they index different corpora")
    if ref.model_checksum != meta.model_checksum:
        problems.append("their passages were embedded by different encoders")
    if problems:
        raise IndexMismatchError(f"cannot audit {index} against {reference}: " + "; ".join(problems))


def _queries(cfg: AuditConfig, meta: IndexMetadata) -> tuple[list[str], str]:
    if (cfg.queries is None) == (cfg.sample is None):
        raise ValueError("give exactly one of --queries FILE or --sample N")
    if cfg.queries is not None:
        return read_queries(cfg.queries), f"{cfg.queries}"
    if cfg.sample < 1:
        raise ValueError(f"--sample must be >= 1, got {cfg.sample}")
    store = CorpusStore.open(cfg.corpus or meta.corpus_path, cache_dir=cfg.index)
    try:
        return sample_queries(store, cfg.sample), f"{cfg.sample} sampled from the corpus"
    finally:
        store.close()


def audit_index(cfg: AuditConfig) -> dict:
    """Run the audit; returns the record (written into the index metadata with ``cfg.write``)."""
    meta, ref_meta = IndexMetadata.load(cfg.index), IndexMetadata.load(cfg.reference)
    check_reference(meta, ref_meta, cfg.index, cfg.reference)
    queries, source = _queries(cfg, meta)
    batch_sizes = [int(b) for b in cfg.batch_sizes.split(",") if b.strip()]
    searcher = DenseSearcher.load(
        cfg.index, meta, model=cfg.model, threads=cfg.threads, in_ram=cfg.in_ram, search_params=search_params(cfg)
    )
    vectors = searcher.encoder.encode(queries, is_query=True, batch_size=64)
    before = process_memory()
    _, rows = searcher.search_vectors(vectors, cfg.k)
    latency = time_batches(searcher.search_vectors, vectors, cfg.k, batch_sizes, max_calls=cfg.latency_calls)
    memory = {"before_search": before, "after_search": process_memory(), "memory_mapped": searcher.memory_mapped}
    reference, _, _ = open_faiss_index(cfg.reference, ref_meta)  # after the memory figures: its pages are not A's
    _, truth = reference.search(vectors, cfg.k)
    record = audit_record(
        k=cfg.k,
        queries=source,
        recall=recall_at_k(rows, truth, cfg.k),
        reference=str(Path(cfg.reference).resolve()),
        params=searcher.search_params,
        latency=latency,
        memory=memory,
    )
    if cfg.write:
        meta.audit = record
        meta.save(cfg.index)
    return record


def format_record(record: dict, index: str) -> str:
    lines = [
        f"audit of {index} ({record['queries']} queries; reference {record['reference']})",
        f"  recall@{record['k']}: {record['recall']:.4f}   search parameters: {record['search_params'] or 'none'}",
        f"  {'batch':>7}{'mean ms':>11}{'p99 ms':>11}{'queries/s':>12}",
    ]
    for batch, row in record["latency"].items():
        lines.append(f"  {batch:>7}{row['mean_ms']:>11.2f}{row['p99_ms']:>11.2f}{row['queries_per_s']:>12.1f}")
    memory = record.get("memory")
    if memory:
        for when in ("before_search", "after_search"):
            m = memory[when]
            lines.append(
                f"  memory {when.replace('_', ' ')}: RSS {_mb(m['rss_mb'])} MB (own {_mb(m['anon_mb'])} MB, "
                f"mapped files {_mb(m['file_mb'])} MB)"
            )
    return "\n".join(lines)


def _mb(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"
