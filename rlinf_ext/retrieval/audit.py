"""How good and how fast an approximate index is: recall@k against exact search, latency per batch size.

Used by ``build-index`` (on a sample of queries, to choose ``nprobe`` / ``efSearch`` / ``k_factor_rf`` and record
the figures in the metadata) and by ``rlinf-ext audit-index`` (against a Flat index of the same corpus).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import faiss
import numpy as np

from .corpus import CorpusStore
from .faiss_index import apply_search_params, tunable_params

# Keys of an audit record (index metadata "audit", GET /health "audit").
AUDIT_K = "k"
AUDIT_QUERIES = "queries"
AUDIT_RECALL = "recall"
AUDIT_REFERENCE = "reference"
AUDIT_PARAMS = "search_params"
AUDIT_LATENCY = "latency"
AUDIT_MEMORY = "memory"
AUDIT_SWEEP = "sweep"
AUDIT_WHEN = "when"

SearchVectors = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]

# Knobs the build tunes, primary first: the first that reaches the recall target with the second at its largest
# value wins, then the smallest second value that still reaches it (other faiss knobs keep their defaults).
PRIMARY_KNOBS = ("nprobe", "efSearch")
SECONDARY_KNOBS = ("k_factor_rf",)
MAX_K_FACTOR = 256  # k * 256 candidates re-scored per query at most (beyond faiss's range, which stops at 64)


def sample_queries(store: CorpusStore, n: int, seed: int = 0) -> list[str]:
    """``n`` queries of 3-8 consecutive words from random passages' text (so that they have real matches)."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(store), size=n, replace=n > len(store))
    queries = []
    for doc in store.get_many(rows):
        words = (doc.get("text") or doc["contents"]).split() or ["empty"]
        start = int(rng.integers(0, max(1, len(words) - 8)))
        queries.append(" ".join(words[start : start + int(rng.integers(3, 9))]))
    return queries


def exact_search(
    emb: np.ndarray, vectors: np.ndarray, k: int, chunk_rows: int = 1 << 18
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force inner-product top-k over an (N, d) array or memmap (float32 or float16), chunk by chunk."""
    heap = faiss.ResultHeap(len(vectors), k, keep_max=True)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    for start in range(0, len(emb), chunk_rows):
        block = np.ascontiguousarray(emb[start : start + chunk_rows], dtype=np.float32)
        scores, rows = faiss.knn(vectors, block, min(k, len(block)), metric=faiss.METRIC_INNER_PRODUCT)
        heap.add_result(scores, np.where(rows >= 0, rows + start, -1))
    heap.finalize()
    return heap.D, heap.I


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean over queries of |found top-k ∩ true top-k| / k (a -1 in ``found``, no result, never counts)."""
    hits = [len({int(r) for r in f[:k] if r >= 0} & {int(r) for r in t[:k]}) for f, t in zip(found, truth)]
    return float(np.mean(hits)) / k


def time_batches(
    search: SearchVectors, vectors: np.ndarray, k: int, batch_sizes: list[int], max_calls: int = 50
) -> dict[str, dict[str, float]]:
    """Per batch size: mean / p99 milliseconds of one ``search`` call and the queries per second it gives."""
    out = {}
    for b in batch_sizes:
        calls = max(1, min(max_calls, len(vectors) // b))
        times = []
        for i in range(calls):
            chunk = vectors[(i * b) % len(vectors) :][:b]
            t0 = time.perf_counter()
            search(chunk, k)
            times.append(time.perf_counter() - t0)
        mean = float(np.mean(times))
        out[str(b)] = {
            "mean_ms": 1e3 * mean,
            "p99_ms": 1e3 * float(np.percentile(times, 99)),
            "queries_per_s": b / mean,
        }
    return out


def audit_record(
    *,
    k: int,
    queries: str,
    recall: float,
    reference: str,
    params: dict,
    latency: dict,
    memory: dict | None = None,
    sweep: list | None = None,
) -> dict:
    """One audit's figures, as stored in the metadata and shown by /health."""
    record = {
        AUDIT_K: k,
        AUDIT_QUERIES: queries,
        AUDIT_RECALL: recall,
        AUDIT_REFERENCE: reference,
        AUDIT_PARAMS: params,
        AUDIT_LATENCY: latency,
        AUDIT_WHEN: time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if memory is not None:
        record[AUDIT_MEMORY] = memory
    if sweep is not None:
        record[AUDIT_SWEEP] = sweep
    return record


def _values(ranges: dict[str, list[float]], names: tuple[str, ...], cap: float | None = None):
    name = next((n for n in names if n in ranges), None)
    values = [int(v) if float(v).is_integer() else v for v in ranges.get(name, []) if cap is None or v <= cap]
    return name, values


def choose_search_params(
    index: faiss.Index, vectors: np.ndarray, truth: np.ndarray, k: int, target: float
) -> tuple[dict[str, float], list[dict]]:
    """The cheapest tuned setting whose recall@k reaches ``target`` (the most thorough one if none does).

    Hand-written instead of faiss's ParameterSpace.explore: explore ranks settings by measured time, which is
    noise on a shared machine; here the choice depends on recall only, so a build is reproducible.
    Returns ``(params, sweep)``; ``sweep`` lists every setting tried with its recall.
    """
    ranges = tunable_params(index)
    first, first_values = _values(ranges, PRIMARY_KNOBS)
    if first == "nprobe":  # faiss's range stops at nlist / 2; every list (exhaustive) is the last resort
        first_values = sorted(set(first_values) | {faiss.extract_index_ivf(index).nlist})
    second, second_values = _values(ranges, SECONDARY_KNOBS, cap=MAX_K_FACTOR)
    while second_values and second_values[-1] < MAX_K_FACTOR:  # re-scoring is cheap next to scanning lists
        second_values.append(second_values[-1] * 2)
    sweep: list[dict] = []

    def recall_with(params: dict[str, float]) -> float:
        apply_search_params(index, params)
        _, rows = index.search(vectors, k)
        sweep.append({"params": dict(params), "recall": recall_at_k(rows, truth, k)})
        return sweep[-1]["recall"]

    best: dict[str, float] = {}
    top_second = {second: second_values[-1]} if second else {}
    for value in first_values or [None]:
        params = ({first: value} if first else {}) | top_second
        if not params:
            return {}, sweep
        best = params
        if recall_with(params) >= target:
            break
    if second and sweep and sweep[-1]["recall"] >= target:
        for value in second_values[:-1]:  # the smallest candidate count that still reaches the target
            trial = best | {second: value}
            if recall_with(trial) >= target:
                best = trial
                break
    apply_search_params(index, best)
    return best, sweep
