"""Sparse BM25 retrieval with ``bm25s`` (no Java): build, save, memory-mapped load, batched search.

bm25s precomputes every (term, doc) BM25 weight into a CSC matrix; a query's scores are the sum of its
terms' postings, summed by bm25s's numba kernel for a whole batch of queries at once, in parallel; ties in the
top-k go to the lower row, so answers are deterministic and do not depend on the batch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .corpus import CorpusStore, file_fingerprint
from .metadata import IndexMetadata
from .searcher import topk_rows

_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")  # bm25s' default splitter


@functools.cache
def _stopwords() -> frozenset[str]:
    # bm25s and numba are imported where used: `import bm25s` loads numba's llvmlite, beside which an in-process
    # vLLM 0.32 engine cannot start on CPU (its kernel registration scans every loaded module)
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


BM25_SUBDIR = "bm25"
VOCAB_KEYS_NAME = "vocab_keys.npy"  # sorted [[token_hash, term_id], ...]: the vocabulary without a Python dict


def token_hash(token: str) -> int:
    """Signed 64-bit blake2b of a token (collisions among ~10^7 tokens: probability ~1e-5, accepted)."""
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little", signed=True)


def vocab_keys(bm25_dir: Path) -> np.ndarray:
    """Memory-map the sorted token-hash table, building it once from bm25s' vocab json if missing.

    wiki-scale vocabularies have millions of tokens; as a Python dict that is GBs of RAM and seconds of
    json parsing at every start, as a sorted int64 array it is 16 bytes per token, memory-mapped.
    """
    path = bm25_dir / VOCAB_KEYS_NAME
    if not path.exists():
        vocab = json.loads((bm25_dir / "vocab.index.json").read_text())
        keys = np.array([(token_hash(t), i) for t, i in vocab.items()], dtype=np.int64).reshape(-1, 2)
        keys = keys[np.argsort(keys[:, 0], kind="stable")]
        tmp = path.with_name(path.name + ".tmp.npy")
        np.save(tmp, keys)
        tmp.replace(path)
    return np.load(path, mmap_mode="r")


def bm25_tokenize(text: str) -> list[str]:
    """Lower-case word tokens of 2+ characters without English stopwords (same for passages and queries)."""
    stopwords = _stopwords()
    return [t for t in _TOKEN_RE.findall(text.lower()) if t not in stopwords]


def build_bm25_index(
    store: CorpusStore, out_dir: str | Path, *, k1: float = 1.5, b: float = 0.75, show_progress: bool = True
) -> IndexMetadata:
    """Tokenise every passage, index with bm25s and save under ``out_dir/bm25`` plus the metadata file."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    ids: list[list[int]] = []
    texts = store.iter_texts()
    if show_progress:
        from tqdm import tqdm

        texts = tqdm(texts, total=len(store), desc="tokenising passages", unit="doc")
    for text in texts:
        ids.append([vocab.setdefault(tok, len(vocab)) for tok in bm25_tokenize(text)])
    import bm25s
    from bm25s.tokenization import Tokenized

    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(Tokenized(ids=ids, vocab=vocab), show_progress=show_progress)
    retriever.save(out_dir / BM25_SUBDIR, show_progress=False)
    vocab_keys(out_dir / BM25_SUBDIR)
    meta = IndexMetadata(
        retriever="bm25",
        corpus_path=str(Path(store.path).resolve()),
        corpus_size=store.path.stat().st_size,
        corpus_checksum=file_fingerprint(store.path),
        passages=len(store),
        faiss_type=None,
        extra={"k1": k1, "b": b, "tokenizer": "lowercase, (?u)\\b\\w\\w+\\b, bm25s English stopwords"},
    )
    meta.save(out_dir)
    return meta


@functools.cache
def numba_kernels():
    """bm25s's numba kernels (batched top-k, parallel over queries; one query's scores), compiled with numba's
    on-disk cache.

    bm25s itself compiles them without caching, once per process: 20-60 s on 2 cores at every server start. The
    functions are bm25s's own (same scoring, same top-k); only the compile options differ.
    """
    import numba
    from bm25s.numba import retrieve_utils
    from bm25s.scoring import _compute_relevance_from_scores_jit_ready

    top_k = numba.njit(cache=True, parallel=True)(retrieve_utils._retrieve_internal_jitted)
    scores = numba.njit(cache=True)(_compute_relevance_from_scores_jit_ready)
    return top_k, scores


class BM25Searcher:
    """Batched BM25 top-k through bm25s's numba kernel, parallel over the queries of a batch.

    Answers are those of one query scored alone with ties going to the lower row: the kernel returns k+1
    candidates; when the k-th and (k+1)-th scores tie, that query is re-ranked from its full score vector.
    """

    retriever = "bm25"
    index_type = "bm25"

    def __init__(
        self, model: Any, keys: np.ndarray, passages: int, threads: int | None = None, memory_mapped: bool = False
    ) -> None:
        self._keys = keys
        self._data = model.scores["data"]
        self._indices = model.scores["indices"]
        self._indptr = model.scores["indptr"]
        self._nonoccurrence = model.nonoccurrence_array
        self._dtype = np.dtype(model.dtype)
        self._int_dtype = np.dtype(model.int_dtype)
        self.passages = passages
        self.threads = threads
        self.memory_mapped = memory_mapped
        self.search_params: dict = {}  # BM25 has none (faiss's nprobe / efSearch / k_factor_rf are dense-only)
        self._lock = threading.Lock()  # numba's default threading layer must not run two parallel kernels at once
        self._top_k, self._scores = numba_kernels()
        self.search([""], 1)  # compiles (or loads the cached) kernels now, not at the first request
        self.search_one([], 1)

    @classmethod
    def load(
        cls, index_dir: str | Path, meta: IndexMetadata, *, in_ram: bool = False, threads: int | None = None
    ) -> BM25Searcher:
        # mmap (default): the score matrix stays on disk and pages in on demand (fast start, small RSS).
        bm25_dir = Path(index_dir) / BM25_SUBDIR
        import bm25s

        model = bm25s.BM25.load(bm25_dir, mmap=not in_ram, load_vocab=False, show_progress=False)
        return cls(model, vocab_keys(bm25_dir), meta.passages, threads=threads, memory_mapped=not in_ram)

    def term_ids(self, query: str) -> list[int]:
        """Vocabulary ids of the query's tokens (unknown tokens dropped, repeats kept)."""
        ids = []
        hashes = self._keys[:, 0]
        for tok in bm25_tokenize(query):
            h = token_hash(tok)
            pos = int(np.searchsorted(hashes, h))
            if pos < len(hashes) and hashes[pos] == h:
                ids.append(int(self._keys[pos, 1]))
        return ids

    def query_scores(self, term_ids: list[int]) -> np.ndarray:
        """BM25 score of every passage for a query's term ids (bm25s' scoring, float32, length = passages)."""
        with self._lock:
            return self._scores(
                self._data,
                self._indptr,
                self._indices,
                self.passages,
                np.asarray(term_ids, dtype=self._int_dtype),
                self._dtype,
            )

    def search_one(self, term_ids: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``k`` of one query from its full score vector (ties to the lower row)."""
        scores = self.query_scores(term_ids)
        best = topk_rows(scores, min(k, self.passages))
        return scores[best], best

    def _candidates(self, ids: list[list[int]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """bm25s's batched kernel: the top-``k`` of every query (unsorted), parallel over the queries."""
        flat = np.asarray([t for q in ids for t in q], dtype=self._int_dtype)
        pointers = np.cumsum([0] + [len(q) for q in ids]).astype(self._int_dtype)
        with self._lock:
            if self.threads:
                import numba

                numba.set_num_threads(min(self.threads, numba.config.NUMBA_NUM_THREADS))
            return self._top_k(
                flat,
                pointers,
                k,
                False,
                self._dtype,
                self._int_dtype,
                self._data,
                self._indptr,
                self._indices,
                self.passages,
                self._nonoccurrence,
                None,
            )

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.passages)
        ids = [self.term_ids(q) for q in queries]
        cand_scores, cand_rows = self._candidates(ids, min(k + 1, self.passages))
        scores = np.zeros((len(queries), k), dtype=np.float32)
        rows = np.zeros((len(queries), k), dtype=np.int64)
        for i in range(len(queries)):
            order = np.lexsort((cand_rows[i], -cand_scores[i]))
            q_scores, q_rows = cand_scores[i][order], cand_rows[i][order]
            if len(q_scores) > k and q_scores[k - 1] == q_scores[k]:
                q_scores, q_rows = self.search_one(ids[i], k)  # which tied rows make the top-k: the lowest
            scores[i], rows[i] = q_scores[:k], q_rows[:k]
        return scores, rows
