"""Cross-request batching: many concurrent small /retrieve requests become one encoder batch + one search.

One asyncio queue and one batcher task. The batcher takes the first waiting request, gathers more until
``max_batch_size`` queries or ``max_wait_s`` has passed, and runs the search for the whole batch in a
single worker thread (so the event loop keeps accepting requests, and the index is only ever used by one
thread: faiss-GPU requires that). Requests asking for different ``k`` are searched in separate calls, so
a request's answer never depends on what else shared its batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

SearchFn = Callable[[list[str], int], tuple[np.ndarray, np.ndarray]]


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)


def run_grouped_by_k(search: SearchFn, items: list[_Pending]) -> list[tuple[np.ndarray, np.ndarray] | BaseException]:
    """Search all items, one call per distinct ``k``; split the answers back per item (runs in the worker)."""
    results: list = [None] * len(items)
    by_k: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        by_k.setdefault(item.k, []).append(i)
    for k, members in by_k.items():
        queries = [q for i in members for q in items[i].queries]
        try:
            scores, rows = search(queries, k)
        except BaseException as e:  # noqa: BLE001 - handed to each waiting request, the batcher lives on
            for i in members:
                results[i] = e
            continue
        start = 0
        for i in members:
            n = len(items[i].queries)
            results[i] = (scores[start : start + n], rows[start : start + n])
            start += n
    return results


class QueryBatcher:
    def __init__(
        self, search: SearchFn, executor: ThreadPoolExecutor, max_batch_size: int = 512, max_wait_s: float = 0.002
    ) -> None:
        self._search = search
        self._executor = executor
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._carry: _Pending | None = None  # a request that did not fit in the previous batch
        self._task: asyncio.Task | None = None
        self.batches_run = 0
        self.queries_run = 0

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize() + (1 if self._carry is not None else 0)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="retrieval-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def submit(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        if self._task is None or self._task.done():
            raise RuntimeError("the batcher is not running")
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(queries, k, future))
        return await future

    async def _next_batch(self) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        first = self._carry if self._carry is not None else await self._queue.get()
        self._carry = None
        batch, size = [first], len(first.queries)
        deadline = loop.time() + self.max_wait_s
        while size < self.max_batch_size:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            if size + len(item.queries) > self.max_batch_size:
                self._carry = item  # starts the next batch; keeps each batch within the limit
                break
            batch.append(item)
            size += len(item.queries)
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            live = [p for p in batch if not p.future.done()]  # skip requests whose client went away
            if not live:
                continue
            try:
                results = await loop.run_in_executor(self._executor, run_grouped_by_k, self._search, live)
            except BaseException as e:
                results = [e] * len(live)
                if isinstance(e, asyncio.CancelledError):
                    for p in live:
                        if not p.future.done():
                            p.future.cancel()
                    raise
            self.batches_run += 1
            self.queries_run += sum(len(p.queries) for p in live)
            for pending, result in zip(live, results):
                if pending.future.done():
                    continue
                if isinstance(result, BaseException):
                    pending.future.set_exception(result)
                else:
                    pending.future.set_result(result)
