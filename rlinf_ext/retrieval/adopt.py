"""`adopt-index`: serve a bare faiss index file (Search-R1's ``e5_Flat.index`` / ``e5_HNSW64.index``) without
re-encoding the corpus.

The file stays where it is: the index directory gets a symbolic link ``faiss.index`` to it, next to the metadata and
the corpus's offsets, and the server memory-maps it through that link like an index it built. A link, because a copy
would double 65 GB of disk and a hard link fails across filesystems (the download disk and the index directory
often differ) and keeps the space taken after the original is deleted; the size/checksum recorded in the metadata
refuses a link whose target was later replaced or truncated.

Adopting reads the index header (memory-mapped: no vector enters the process's own memory), checks it against the
encoder and the corpus, and re-encodes a sample of passages, which must come back at rank 1. Every disagreement is
refused with what disagrees and the fix. Supported: Flat and HNSW (``IndexFlatIP``, ``IndexHNSWFlat``, the two
dense indexes Search-R1 publishes). Search-R1's BM25 index is a Lucene (pyserini, Java) directory, which this
server does not read: build a BM25 index with ``build-index --retriever bm25`` instead (minutes, no GPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from .audit import AUDIT_K, AUDIT_RECALL, audit_record, choose_search_params, recall_at_k, sample_queries, time_batches
from .config import AdoptConfig
from .corpus import CorpusStore, file_fingerprint, passage_text_for_index
from .dense import resolve_device, use_blas_for_batches
from .encoder import EncoderSpec, TextEncoder
from .faiss_index import EXACT_TYPE, FAISS_NAME, MMAP_FLAGS, apply_search_params
from .hub import resolve_model_dir
from .metadata import METADATA_NAME, IndexMetadata, IndexMismatchError, model_fingerprint

# index_meta.json "extra" keys of an adopted index
ADOPTED_FROM = "adopted_from"
ADOPT_CHECK = "adopt_check"
CHECK_ROWS = "rows"
CHECK_RANK1 = "rank1"
CHECK_MIN_COSINE = "min_cosine"

# A sampled passage is "at rank 1" when no other row scores above its own stored vector by more than this
# (duplicate passages of wiki-18 have identical vectors and tie).
RANK_TIE_TOLERANCE = 1e-5
CHECK_EF_SEARCH = 256  # HNSW breadth while checking: the sample must not fail on a narrow default search
LUCENE_MARK = "segments"  # every Lucene index directory holds segments_N


class AdoptError(IndexMismatchError):
    """The faiss file, the encoder and the corpus do not belong together; the message names each problem and fix."""


@dataclass(frozen=True)
class RankCheck:
    rows: list[int]
    at_rank1: int
    min_cosine: float
    failures: list[str]


def check_rows(passages: int, sample: int) -> np.ndarray:
    """Rows whose passages are re-encoded: ``sample`` spread evenly over the corpus, the first and last included
    (a corpus shifted by one row, or cut short, differs most at the end)."""
    if passages <= 0 or sample <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.linspace(0, passages - 1, min(sample, passages)).round().astype(np.int64))


def index_type_name(index: faiss.Index) -> str | None:
    """The factory string of a Flat or HNSW(Flat) index (``Flat``, ``HNSW64``); None for any other type."""
    concrete = faiss.downcast_index(index)
    if isinstance(concrete, faiss.IndexHNSWFlat):
        return f"HNSW{concrete.hnsw.nb_neighbors(1)}"  # level 0 has 2*M links, the upper levels M
    if isinstance(concrete, faiss.IndexFlat):
        return EXACT_TYPE
    return None


def _refuse_directory(path: Path) -> AdoptError:
    if any(p.name.startswith(LUCENE_MARK) for p in path.iterdir()):
        return AdoptError(
            f"{path} is a Lucene index (Search-R1's BM25 index, built by pyserini), which this server "
            "does not read. Build a BM25 index from the corpus instead: `rlinf-ext build-index "
            "--retriever bm25 --corpus wiki-18.jsonl --out DIR` (CPU, no model)."
        )
    return AdoptError(f"--faiss {path} is a directory; pass the faiss index file itself (e.g. e5_Flat.index)")


def open_bare_index(path: str | os.PathLike) -> faiss.Index:
    """Memory-map a bare faiss file, or refuse it: missing, a directory (Lucene), truncated or not faiss."""
    path = Path(path)
    if path.is_dir():
        raise _refuse_directory(path)
    if not path.is_file():
        hint = (
            " (the download writes part_aa, part_ab: `cat part_* > e5_Flat.index`)"
            if path.parent.is_dir() and any(path.parent.glob("part_a?"))
            else ""
        )
        raise AdoptError(f"--faiss {path}: file not found{hint}")
    try:
        return faiss.read_index(str(path), MMAP_FLAGS)
    except RuntimeError as e:
        detail = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise AdoptError(
            f"--faiss {path} ({path.stat().st_size} bytes) is truncated or not a faiss index: faiss cannot read it "
            f"({detail[:200]}). A download cut off, or parts concatenated incompletely or out of order. Fix: rerun "
            "examples/searchr1/download.py (it resumes, checks the hub's sha256 and concatenates part_aa, part_ab "
            "in order), or `cat part_aa part_ab > e5_Flat.index` once both parts are complete."
        ) from e


def header_problems(
    index: faiss.Index, *, retriever: str, encoder_dim: int, model: str, corpus_rows: int, corpus: str
) -> list[str]:
    """What the index's header says that disagrees with the encoder and the corpus, each with its fix."""
    problems = []
    if index_type_name(index) is None:
        problems.append(
            f"it is a {type(faiss.downcast_index(index)).__name__}; adopt-index takes Flat and HNSW "
            "(IndexFlatIP, IndexHNSWFlat) files. Fix: build the index with `rlinf-ext build-index "
            "--faiss-type ...` (any faiss type)"
        )
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        problems.append(
            f"its metric is not inner product (faiss metric {index.metric_type}), but {retriever} vectors "
            f"are compared by inner product (cosine). Fix: use an index built with METRIC_INNER_PRODUCT "
            f"(Search-R1's are), or build one with `rlinf-ext build-index --retriever {retriever}`"
        )
    if index.d != encoder_dim:
        problems.append(
            f"its vectors are {index.d}-d but the encoder {model} gives {encoder_dim}-d vectors. Fix: pass "
            "the encoder the index was built with (--model; Search-R1's e5 indexes are 768-d, "
            "intfloat/e5-base-v2)"
        )
    if index.ntotal != corpus_rows:
        problems.append(
            f"it holds {index.ntotal} vectors but the corpus {corpus} has {corpus_rows} rows (row i must "
            "be the passage of vector i). Fix: pass the corpus the index was built over, complete "
            "(Search-R1's e5 indexes: wiki-18.jsonl, 21015324 rows; a cut-off download or unpack has "
            "fewer)"
        )
    return problems


def check_rank_one(index: faiss.Index, encoder: TextEncoder, store: CorpusStore, rows: np.ndarray) -> RankCheck:
    """Re-encode the passages of ``rows`` and search them: each must find its own row first (or tied first)."""
    docs = store.get_many(rows)
    encoded = encoder.encode([passage_text_for_index(d) for d in docs], is_query=False, batch_size=16)
    stored = np.stack([index.reconstruct(int(r)) for r in rows]).astype(np.float32)
    own = np.einsum("ij,ij->i", encoded, stored)
    cosine = own / np.maximum(np.linalg.norm(encoded, axis=1) * np.linalg.norm(stored, axis=1), 1e-12)
    hnsw = faiss.downcast_index(index)
    ef = hnsw.hnsw.efSearch if isinstance(hnsw, faiss.IndexHNSW) else None
    if ef is not None:
        apply_search_params(index, {"efSearch": max(ef, CHECK_EF_SEARCH)})
    try:
        scores, found = index.search(encoded, min(3, index.ntotal))
    finally:
        if ef is not None:
            apply_search_params(index, {"efSearch": ef})
    failures = []
    for i, row in enumerate(rows):
        if found[i, 0] == row or scores[i, 0] - own[i] <= RANK_TIE_TOLERANCE:
            continue
        title = str(docs[i].get("title") or docs[i]["contents"])[:60]
        failures.append(
            f"row {row} ({title!r}) comes back behind row {found[i, 0]} (score {scores[i, 0]:.4f} vs "
            f"{own[i]:.4f} for its own vector; cosine of the re-encoded passage to its stored vector "
            f"{cosine[i]:.3f})"
        )
    return RankCheck(
        rows=[int(r) for r in rows],
        at_rank1=len(rows) - len(failures),
        min_cosine=float(cosine.min()) if len(rows) else 1.0,
        failures=failures,
    )


def audit_hnsw(
    index: faiss.Index, encoder: TextEncoder, store: CorpusStore, sample: int, k: int, target: float
) -> tuple[dict, dict]:
    """efSearch reaching ``target`` recall@k on sampled queries against exact search over the vectors the HNSW index
    stores (its Flat storage: the same vectors, searched exhaustively); returns (search params, audit record)."""
    queries = sample_queries(store, sample)
    vectors = encoder.encode(queries, is_query=True, batch_size=64)
    storage = faiss.downcast_index(faiss.downcast_index(index).storage)
    _, truth = storage.search(vectors, k)
    params, sweep = choose_search_params(index, vectors, truth, k, target)
    _, rows = index.search(vectors, k)
    record = audit_record(
        k=k,
        queries=f"{len(queries)} sampled from the corpus",
        recall=recall_at_k(rows, truth, k),
        reference="exact search over the vectors stored in the HNSW index",
        params=params,
        latency=time_batches(index.search, vectors, k, [1, 16, 64]),
        sweep=sweep,
    )
    return params, record


def link_index_file(out: Path, target: Path) -> Path:
    """``out/faiss.index`` -> ``target`` (absolute symbolic link, replaced if it pointed elsewhere)."""
    link = out / FAISS_NAME
    if link.exists() and not link.is_symlink():
        raise AdoptError(
            f"--out {out} already holds an index built here ({link} is a file, not a link); pass another --out"
        )
    tmp = out / (FAISS_NAME + ".link.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)
    return link


def adopt_index(cfg: AdoptConfig, show_progress: bool = True) -> IndexMetadata:
    """Check ``cfg.faiss`` against the encoder and the corpus, then write the index directory ``cfg.out``."""
    if cfg.check_sample < 1:
        raise ValueError(
            f"--check-sample must be >= 1 (passages re-encoded and found at rank 1), got {cfg.check_sample}"
        )
    source = Path(cfg.faiss).expanduser()
    index = open_bare_index(source)
    model_dir = resolve_model_dir(cfg.model)
    spec = EncoderSpec.for_retriever(cfg.retriever, str(model_dir), max_length=cfg.max_length, pooling=cfg.pooling)
    encoder = TextEncoder(spec, device=resolve_device(cfg.device), threads=cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / METADATA_NAME).unlink(missing_ok=True)  # unfinished until the end
    store = CorpusStore.open(cfg.corpus, cache_dir=out, show_progress=show_progress)
    try:
        problems = header_problems(
            index,
            retriever=cfg.retriever,
            encoder_dim=encoder.dim,
            model=cfg.model,
            corpus_rows=len(store),
            corpus=str(store.path),
        )
        if problems:
            raise AdoptError(f"cannot adopt {source}:\n  - " + "\n  - ".join(problems))
        faiss_type = index_type_name(index)
        use_blas_for_batches()  # the sample is searched in one pass over a Flat index, not one pass per passage
        if show_progress:
            print(
                f"checking that {min(cfg.check_sample, index.ntotal)} re-encoded passages come back at rank 1 "
                f"(one search over {index.ntotal} vectors)",
                flush=True,
            )
        check = check_rank_one(index, encoder, store, check_rows(index.ntotal, cfg.check_sample))
        if check.failures:
            raise AdoptError(
                f"cannot adopt {source}: {len(check.failures)} of {len(check.rows)} sampled passages re-encoded with "
                f"{cfg.model} do not come back at rank 1:\n  - "
                + "\n  - ".join(check.failures)
                + f"\nThe corpus rows are not in the order the index was built in, or the encoder differs from the "
                f"build's (--model, --retriever {cfg.retriever}, --max-length {cfg.max_length}). Fix: pass the corpus "
                "and encoder the index was built with (Search-R1's e5_Flat.index: wiki-18.jsonl and "
                "intfloat/e5-base-v2, --retriever e5)."
            )
        search_params, audit = {}, None
        if faiss_type != EXACT_TYPE and cfg.audit_sample > 0:
            search_params, audit = audit_hnsw(index, encoder, store, cfg.audit_sample, cfg.audit_k, cfg.recall_target)
        target = source.resolve()
        link_index_file(out, target)
        meta = IndexMetadata(
            retriever=cfg.retriever,
            corpus_path=str(store.path.resolve()),
            corpus_size=store.path.stat().st_size,
            corpus_checksum=file_fingerprint(store.path),
            passages=int(index.ntotal),
            model=str(model_dir.resolve()),
            model_checksum=model_fingerprint(model_dir),
            dim=int(index.d),
            pooling=spec.pooling,
            query_prefix=spec.query_prefix,
            passage_prefix=spec.passage_prefix,
            max_length=spec.max_length,
            faiss_type=faiss_type,
            faiss_checksum=file_fingerprint(target),
            search_params=search_params,
            audit=audit,
            extra={
                ADOPTED_FROM: str(target),
                ADOPT_CHECK: {CHECK_ROWS: check.rows, CHECK_RANK1: check.at_rank1, CHECK_MIN_COSINE: check.min_cosine},
            },
        )
        meta.save(out)
    finally:
        store.close()
    return meta


def format_summary(meta: IndexMetadata, out: str) -> str:
    """What was adopted, for the terminal."""
    check = meta.extra[ADOPT_CHECK]
    lines = [
        f"adopted {meta.extra[ADOPTED_FROM]} into {out} (faiss.index links to it; memory-mapped when served)",
        f"  faiss    {meta.faiss_type}, {meta.passages} x {meta.dim}, inner product",
        f"  encoder  {meta.model} ({meta.retriever}, {meta.pooling} pooling, max length {meta.max_length})",
        f"  corpus   {meta.corpus_path}: {meta.passages} rows",
        (
            f"  check    {check[CHECK_RANK1]}/{len(check[CHECK_ROWS])} sampled passages re-encoded at rank 1 (cosine to "
            f"the stored vectors >= {check[CHECK_MIN_COSINE]:.4f})"
        ),
    ]
    if meta.search_params:
        lines.append(
            f"  search   {meta.search_params} (recall@{meta.audit[AUDIT_K]} {meta.audit[AUDIT_RECALL]:.4f} "
            "against exact search)"
        )
    lines.append(f"serve it: rlinf-ext serve-retriever --index {out} --corpus {meta.corpus_path}")
    return "\n".join(lines)
