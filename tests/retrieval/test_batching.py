"""The cross-request batcher with a fake search function (no server)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rlinf_ext.retrieval.batching import QueryBatcher


class FakeSearch:
    """Score of (query, row) = len(query) * 10 + row; records every call's (queries, k) and its thread."""

    def __init__(self, delay_s=0.02):
        self.calls = []
        self.threads = set()
        self.delay_s = delay_s

    def __call__(self, queries, k):
        self.calls.append((list(queries), k))
        self.threads.add(threading.get_ident())
        if "boom" in queries:
            raise RuntimeError("boom query")
        time.sleep(self.delay_s)  # the first batch runs while the others queue up
        rows = np.tile(np.arange(k), (len(queries), 1))
        scores = np.array([[len(q) * 10 + r for r in range(k)] for q in queries], dtype=np.float32)
        return scores, rows


async def _run(batcher, requests):
    batcher.start()
    try:
        return await asyncio.gather(*[batcher.submit(q, k) for q, k in requests], return_exceptions=True)
    finally:
        await batcher.stop()


@pytest.mark.timeout(30)
def test_concurrent_requests_are_batched_and_answers_split_back():
    search = FakeSearch()
    batcher = QueryBatcher(search, ThreadPoolExecutor(1), max_batch_size=16, max_wait_s=0.01)
    requests = [([f"q{'x' * i}"], 3) for i in range(40)]
    results = asyncio.run(_run(batcher, requests))
    for (queries, k), (scores, rows) in zip(requests, results):
        assert rows.tolist() == [[0, 1, 2]]
        assert scores.tolist() == [[len(queries[0]) * 10 + r for r in range(k)]]
    assert len(search.calls) < 40  # gathered into batches ...
    assert max(len(q) for q, _ in search.calls) <= 16  # ... never above max_batch_size
    assert len(search.threads) == 1  # one worker thread touches the index
    assert batcher.queries_run == 40


@pytest.mark.timeout(30)
def test_different_k_are_searched_separately_and_errors_stay_per_request():
    search = FakeSearch()
    batcher = QueryBatcher(search, ThreadPoolExecutor(1), max_batch_size=64, max_wait_s=0.05)
    results = asyncio.run(_run(batcher, [(["a", "bb"], 2), (["ccc"], 5), (["boom"], 7), (["d"], 2)]))
    assert results[0][0].tolist() == [[10, 11], [20, 21]] and results[3][0].tolist() == [[10, 11]]
    assert results[1][1].shape == (1, 5)
    assert isinstance(results[2], RuntimeError)
    assert sorted(k for _, k in search.calls) == [2, 5, 7]  # "a","bb","d" shared one k=2 call
