"""Typed options of the index builder and the retrieval server (the CLI flags are generated from these)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field


def parse_gpu_ids(spec: str, available: int) -> list[int]:
    """``--gpus`` -> device ids: ``all`` = every visible GPU, else a comma list; an id that is not visible is a
    ValueError naming it."""
    ids = list(range(available)) if spec.strip() == "all" else [int(g) for g in spec.split(",") if g.strip()]
    missing = [g for g in ids if not 0 <= g < available]
    if not ids or missing:
        raise ValueError(
            f"--gpus {spec!r}: {available} GPU(s) visible (ids 0..{available - 1}), asked for "
            f"{missing or 'none'}; pass 'all' or ids below {available}"
        )
    return ids


def _opt(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ServerConfig:
    index: str = _opt(None, "Index directory written by build-index (holds index_meta.json).", required=True)
    corpus: str = _opt(
        None,
        "Corpus jsonl the index was built from (rows: id, contents[, url, title, text]); a "
        ".jsonl.gz is unpacked once beside it.",
        required=True,
    )
    pages: str | None = _opt(None, "Pages jsonl (ASearcher wiki_webpages.jsonl) served by POST /access.")
    model: str | None = _opt(
        None, "Dense encoder directory or hub id; default: the one recorded in the index metadata."
    )
    retriever: str | None = _opt(None, "Expected retriever (bm25|e5|bge); refused if the index is another.")
    host: str = _opt("127.0.0.1", "Bind address. 127.0.0.1 by default; pass 0.0.0.0 explicitly to expose it.")
    port: int = _opt(8000, "Port; 0 picks a free port (printed and written to the address file).")
    topk: int = _opt(3, "Default top-k when a request sends topk null or omits it.")
    max_topk: int = _opt(100, "Largest topk a request may ask for (4xx above).")
    max_queries: int = _opt(4096, "Most queries in one /retrieve or urls in one /access request (4xx above).")
    max_query_chars: int = _opt(4096, "Longest query string accepted (4xx above).")
    max_body_bytes: int = _opt(8 << 20, "Largest request body accepted (413 above).")
    max_batch_size: int = _opt(512, "Cross-request batching: most queries searched together in one call.")
    max_wait_ms: float = _opt(2.0, "Cross-request batching: how long the batcher waits to fill a batch.")
    no_batching: bool = _opt(False, "Serve one request at a time without cross-request batching (comparison).")
    device: str = _opt("auto", "Dense encoder device: auto (cuda if available), cpu or cuda.")
    gpus: str | None = _opt(None, "Put the faiss index on GPUs (sharded, fp16): 'all' or a list like 0,1.")
    threads: int | None = _opt(
        None,
        "CPU threads of the dense query encoder and of BM25 scoring (default: "
        "torch's / numba's default; 1 is often fastest on an oversubscribed machine).",
    )
    in_ram: bool = _opt(
        False,
        "Read the index into RAM instead of memory-mapping it (mapped: opens in seconds, "
        "its pages are page cache the kernel can evict).",
    )
    nprobe: int | None = _opt(
        None, "IVF lists searched per query (default: the index metadata's, chosen by the build's audit)."
    )
    ef_search: int | None = _opt(None, "HNSW search breadth efSearch (default: the index metadata's).")
    k_factor: int | None = _opt(
        None,
        "Re-ranking indexes (...,Refine(...)): candidates re-scored exactly = "
        "k_factor x topk (default: the index metadata's).",
    )
    save_address_to: str | None = _opt(
        None,
        "Directory to write this server's address file into "
        "(Host<host>_IP<port>.txt containing host:port; removed on exit).",
    )
    log_level: str = _opt("warning", "uvicorn log level.")


@dataclass
class BuildConfig:
    corpus: str = _opt(None, "Corpus jsonl to index (a .jsonl.gz is unpacked once beside it).", required=True)
    out: str = _opt(None, "Output index directory.", required=True)
    retriever: str = _opt(
        "bm25", "bm25 (sparse, no model), e5 or bge (dense, needs --model).", choices=["bm25", "e5", "bge"]
    )
    model: str | None = _opt(
        None,
        "Dense encoder: a directory in HF transformers format, or a hub id such as "
        "intfloat/e5-base-v2 (fetched once into the Hugging Face cache).",
    )
    faiss_type: str = _opt(
        "Flat",
        "A preset (flat; flat-fp16: exact over fp16 codes; approx: IVF + 4-bit PQ "
        "with exact re-rank over fp16 vectors) or a faiss index_factory string "
        "(HNSW32, IVF4096,PQ96x4fs,Refine(SQfp16), ...).",
    )
    batch_size: int = _opt(64, "Dense: passages per encoder batch.")
    max_length: int = _opt(256, "Dense: max tokens per passage/query.")
    pooling: str | None = _opt(None, "Dense pooling (mean|cls); default from the retriever (e5 mean, bge cls).")
    device: str = _opt("auto", "Encoder device: auto, cpu or cuda.")
    gpus: str | None = _opt(
        None, "Encode on these GPUs ('all' or 0,1,...): each batch is split over them (torch DataParallel)."
    )
    threads: int | None = _opt(None, "CPU threads of the encoder (default: torch's default).")
    keep_embeddings: bool = _opt(False, "Dense: keep the passage embedding memmap after the index is written.")
    audit_sample: int = _opt(
        1000,
        "Approximate dense types: queries sampled from the corpus to choose nprobe / "
        "efSearch / k_factor by recall against exact search (0: skip, keep faiss's "
        "defaults).",
    )
    audit_k: int = _opt(3, "Approximate dense types: the k of the recall@k the audit tunes for.")
    recall_target: float = _opt(0.99, "Approximate dense types: recall@k the chosen search parameters must reach.")


@dataclass
class AdoptConfig:
    faiss: str = _opt(
        None,
        "Bare faiss index file written by faiss.write_index over the corpus's passage vectors "
        "(Search-R1's e5_Flat.index or e5_HNSW64.index). Linked, never copied.",
        required=True,
    )
    corpus: str = _opt(
        None,
        "Corpus the index was built over, row i = vector i (wiki-18.jsonl, or wiki-18.jsonl.gz "
        "which is unpacked once beside it).",
        required=True,
    )
    retriever: str = _opt(
        None, "Encoder family the vectors come from (sets prefixes and pooling).", required=True, choices=["e5", "bge"]
    )
    model: str = _opt(
        None,
        "Encoder the passages were embedded with: a directory ($WORK/models/e5-base-v2) or a hub "
        "id (intfloat/e5-base-v2).",
        required=True,
    )
    out: str = _opt(
        None,
        "Index directory to write (index_meta.json, a link faiss.index -> --faiss, the corpus's "
        "offsets); serve it with serve-retriever --index.",
        required=True,
    )
    max_length: int = _opt(256, "Max tokens per passage/query (Search-R1 built its indexes with 256).")
    pooling: str | None = _opt(None, "Pooling (mean|cls); default from the retriever (e5 mean, bge cls).")
    check_sample: int = _opt(
        16,
        "Passages (spread over the corpus, first and last included) re-encoded with --model "
        "that must come back at rank 1; one search over the whole index.",
    )
    device: str = _opt("auto", "Encoder device for the check: auto, cpu or cuda.")
    threads: int | None = _opt(None, "CPU threads of the encoder (default: torch's default).")
    audit_sample: int = _opt(
        1000,
        "HNSW indexes: queries sampled from the corpus to choose efSearch by recall "
        "against exact search over the vectors the index stores (0: keep faiss's "
        "default efSearch 16).",
    )
    audit_k: int = _opt(3, "HNSW indexes: the k of the recall@k the audit tunes for.")
    recall_target: float = _opt(0.99, "HNSW indexes: recall@k the chosen efSearch must reach.")


@dataclass
class AuditConfig:
    index: str = _opt(None, "Index directory to audit (an approximate or fp16 dense index).", required=True)
    reference: str = _opt(
        None, "Flat index directory over the same corpus with the same encoder (exact search).", required=True
    )
    queries: str | None = _opt(None, "Query file: one query per line, or jsonl with a 'question' or 'query' field.")
    sample: int | None = _opt(None, "Instead of --queries: this many queries sampled from the corpus passages.")
    corpus: str | None = _opt(None, "Corpus to sample from (default: the one recorded in the index metadata).")
    k: int = _opt(3, "recall@k against the reference.")
    batch_sizes: str = _opt("1,16,64", "Comma list of batch sizes to time searches at.")
    latency_calls: int = _opt(50, "Timed search calls per batch size (at most).")
    model: str | None = _opt(None, "Encoder directory (default: the one recorded in the index metadata).")
    threads: int | None = _opt(None, "CPU threads of the query encoder.")
    in_ram: bool = _opt(False, "Read the audited index into RAM instead of memory-mapping it.")
    nprobe: int | None = _opt(None, "Audit with this nprobe instead of the metadata's.")
    ef_search: int | None = _opt(None, "Audit with this efSearch instead of the metadata's.")
    k_factor: int | None = _opt(None, "Audit with this re-rank k_factor instead of the metadata's.")
    write: bool = _opt(False, "Store the figures in the index metadata (shown by the server's /health).")


# Search-parameter options (ServerConfig / AuditConfig field) -> faiss ParameterSpace names.
SEARCH_PARAM_OPTIONS = {"nprobe": "nprobe", "ef_search": "efSearch", "k_factor": "k_factor_rf"}


def search_params(cfg) -> dict[str, int]:
    """The faiss search parameters a server/audit config sets explicitly (the rest come from the metadata)."""
    out = {}
    for option, name in SEARCH_PARAM_OPTIONS.items():
        value = getattr(cfg, option)
        if value is not None:
            if value < 1:
                raise ValueError(f"--{option.replace('_', '-')} must be >= 1, got {value}")
            out[name] = value
    return out


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """One ``--flag`` per field (underscores become dashes), help text and defaults from the dataclass."""
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        meta = dict(f.metadata)
        help_text = meta.pop("help")
        if f.type in ("bool", bool):
            parser.add_argument(flag, dest=f.name, action="store_true", help=help_text)
            continue
        base = str(f.type).replace(" | None", "")  # annotations are strings (postponed evaluation)
        kind = {"int": int, "float": float, "str": str}[base]
        default = None if meta.get("required") else f.default
        parser.add_argument(flag, dest=f.name, type=kind, default=default, help=help_text, **meta)


def from_args(cls, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
