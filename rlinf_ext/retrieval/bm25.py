"""Sparse BM25 retrieval with ``bm25s`` (pure Python/numpy, no Java): build, save, memory-mapped load, search.

bm25s precomputes every (term, doc) BM25 weight into a CSC matrix; a query's scores are the sum of its
terms' postings (one ``bincount``); ties in the top-k go to the lower row, so answers are deterministic.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN
from bm25s.tokenization import Tokenized

from .corpus import CorpusStore, file_fingerprint
from .metadata import IndexMetadata
from .searcher import topk_rows

_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")  # bm25s' default splitter
_STOPWORDS = frozenset(STOPWORDS_EN)
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
    return [t for t in _TOKEN_RE.findall(text.lower()) if t not in _STOPWORDS]


def build_bm25_index(store: CorpusStore, out_dir: str | Path, *, k1: float = 1.5, b: float = 0.75,
                     show_progress: bool = True) -> IndexMetadata:
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
    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(Tokenized(ids=ids, vocab=vocab), show_progress=show_progress)
    retriever.save(out_dir / BM25_SUBDIR, show_progress=False)
    vocab_keys(out_dir / BM25_SUBDIR)
    meta = IndexMetadata(
        retriever="bm25", corpus_path=str(Path(store.path).resolve()), corpus_size=store.path.stat().st_size,
        corpus_checksum=file_fingerprint(store.path), passages=len(store), faiss_type=None,
        extra={"k1": k1, "b": b, "tokenizer": "lowercase, (?u)\\b\\w\\w+\\b, bm25s English stopwords"},
    )
    meta.save(out_dir)
    return meta


class BM25Searcher:
    retriever = "bm25"
    index_type = "bm25"

    def __init__(self, model: bm25s.BM25, keys: np.ndarray, passages: int) -> None:
        self._keys = keys
        self._data = model.scores["data"]
        self._indices = model.scores["indices"]
        self._indptr = model.scores["indptr"]
        self.passages = passages

    @classmethod
    def load(cls, index_dir: str | Path, meta: IndexMetadata) -> BM25Searcher:
        # mmap: the score matrix stays on disk and pages in on demand (fast start, small RSS).
        bm25_dir = Path(index_dir) / BM25_SUBDIR
        model = bm25s.BM25.load(bm25_dir, mmap=True, load_vocab=False, show_progress=False)
        return cls(model, vocab_keys(bm25_dir), meta.passages)

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

    def query_scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query`` (float32, length = passages)."""
        term_ids = self.term_ids(query)
        if not term_ids:
            return np.zeros(self.passages, dtype=np.float32)
        spans = [(int(self._indptr[t]), int(self._indptr[t + 1])) for t in term_ids]
        rows = np.concatenate([self._indices[s:e] for s, e in spans])
        weights = np.concatenate([self._data[s:e] for s, e in spans])
        # One pass over the query's postings; summing in float64 makes the order of terms irrelevant.
        return np.bincount(rows, weights=weights, minlength=self.passages).astype(np.float32)

    def search_one(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores = self.query_scores(query)
        best = topk_rows(scores, min(k, self.passages))
        return scores[best], best

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.passages)
        scores = np.zeros((len(queries), k), dtype=np.float32)
        rows = np.zeros((len(queries), k), dtype=np.int64)
        for i, q in enumerate(queries):
            scores[i], rows[i] = self.search_one(q, k)
        return scores, rows
