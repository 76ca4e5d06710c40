"""Text search: the client (``SearchTool``: backends + process-wide rate limit + in-flight cap + bounded retries)
and the Search-R1 tool over it (``TextSearch``: `<search> query </search>` -> the retrieved passages as text).

Worst case per call, after the rate-limit slot and in-flight slot are granted:
    default_timeout * (max_retries + 1) + sum of backoffs (each <= MAX_BACKOFF_S * 1.5).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from rlinf_ext.tools.addresses import resolve_server_urls, urls_for_node
from rlinf_ext.tools.backends import RetryableSearchError, SearchRequestError, make_backend
from rlinf_ext.tools.base import Tool, ToolContext, ToolMetricNames, ToolOutput, refuse_setting_problems
from rlinf_ext.tools.config import SearchToolConfig
from rlinf_ext.tools.documents import Document
from rlinf_ext.tools.formatting import SEARCHR1_STYLE, format_documents, search_failed_text
from rlinf_ext.tools.ledger import charge_tool_seconds
from rlinf_ext.tools.rate_limit import shared_token_bucket

MAX_BACKOFF_S = 30.0


class SearchError(RuntimeError):
    """Raised instead of a failure observation when `tools.search.fail_on_search_error` is true."""


@dataclass
class SearchResult:
    query: str
    ok: bool
    documents: list[Document] = field(default_factory=list)
    error: str | None = None
    attempts: int = 0
    latency_s: float = 0.0  # wall time of the HTTP attempts and backoffs (excludes rate-limit queueing)
    wait_s: float = 0.0  # time spent waiting for a rate-limit token / in-flight slot


@dataclass
class SearchStats:
    calls: int = 0
    failures: int = 0
    attempts: int = 0
    retries: int = 0
    latencies_s: list[float] = field(default_factory=list)

    def record(self, result: SearchResult) -> None:
        self.calls += 1
        self.failures += 0 if result.ok else 1
        self.attempts += result.attempts
        self.retries += max(0, result.attempts - 1)
        self.latencies_s.append(result.latency_s)


def backoff_delay(attempt: int, base: float, rng: random.Random) -> float:
    """Exponential backoff with multiplicative jitter in [0.5, 1.5): attempt 0 -> ~base, 1 -> ~2*base, ..."""
    return min(base * (2**attempt), MAX_BACKOFF_S) * rng.uniform(0.5, 1.5)


class SearchTool:
    """`await tool.search(query) -> SearchResult`, with the `tools.search` settings (`SearchToolConfig`).

    Calls are spread round-robin over the servers of the client's node (``node_ip``: the Ray node a worker runs
    on; ``home_ip``: the launcher's node, where loopback addresses point), or over all servers when none is on
    this node; a failed attempt is retried on the next server, the other nodes' servers after this node's.
    """

    def __init__(self, cfg: Any, seed: int | None = None, node_ip: str | None = None, home_ip: str | None = None):
        refuse_setting_problems(cfg, "tools.search")
        self.cfg = cfg
        self.backend = make_backend(cfg.backend)
        if self.backend.needs_server:
            self.local_urls, self.other_urls = urls_for_node(resolve_server_urls(cfg.server_addr), node_ip, home_ip)
        else:
            self.local_urls, self.other_urls = [], [None]
        self.urls: list[str | None] = [*self.local_urls, *self.other_urls]
        self._next_url = itertools.count()
        self._bucket = shared_token_bucket(cfg.rate_limit)
        self._slots: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = (
            weakref.WeakKeyDictionary()
        )
        self._rng = random.Random(seed)
        self.stats = SearchStats()

    @property
    def max_call_seconds(self) -> float:
        """Upper bound of one call once it holds its slot (timeouts plus the largest possible backoffs)."""
        retries = int(self.cfg.max_retries)
        backoffs = sum(min(self.cfg.backoff_base * 2**k, MAX_BACKOFF_S) * 1.5 for k in range(retries))
        return float(self.cfg.default_timeout) * (retries + 1) + backoffs

    def _slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        slot = self._slots.get(loop)
        if slot is None:
            slot = self._slots[loop] = asyncio.Semaphore(int(self.cfg.num_workers))
        return slot

    async def search(self, query: str) -> SearchResult:
        queued = time.monotonic()
        async with self._slot():
            if self._bucket is not None:
                await self._bucket.acquire()
            started = time.monotonic()
            result = await self._search_with_retries(query)
            result.wait_s = started - queued
            result.latency_s = time.monotonic() - started
        self.stats.record(result)
        charge_tool_seconds(result.latency_s)  # raw searches (MMSearch-R1) and TextSearch.run alike
        if not result.ok and self.cfg.fail_on_search_error:
            raise SearchError(
                f"search for {query!r} failed after {result.attempts} attempt(s): {result.error} "
                "(set tools.search.fail_on_search_error: false to continue with a failure observation)"
            )
        return result

    def _attempt_order(self, call: int) -> list[str | None]:
        """The servers call number ``call`` tries, in order: this node's (rotated by ``call``), then the others
        (rotated likewise)."""

        def rotated(urls: list) -> list:
            return urls[call % len(urls) :] + urls[: call % len(urls)] if urls else []

        return rotated(self.local_urls) + rotated(self.other_urls)

    async def _search_with_retries(self, query: str) -> SearchResult:
        timeout = float(self.cfg.default_timeout)
        order = self._attempt_order(next(self._next_url))
        error = "no attempt made"
        for attempt in range(int(self.cfg.max_retries) + 1):
            url = order[attempt % len(order)]  # retries move on to the next server
            try:
                docs = await asyncio.wait_for(self.backend.search(query, int(self.cfg.topk), timeout, url), timeout)
                return SearchResult(query=query, ok=True, documents=docs, attempts=attempt + 1)
            except SearchRequestError as exc:  # 4xx / malformed: not retried
                return SearchResult(query=query, ok=False, error=str(exc), attempts=attempt + 1)
            except (RetryableSearchError, asyncio.TimeoutError) as exc:
                error = str(exc) or f"timeout after {timeout:g}s"
            if attempt < int(self.cfg.max_retries):
                await asyncio.sleep(backoff_delay(attempt, float(self.cfg.backoff_base), self._rng))
        return SearchResult(query=query, ok=False, error=error, attempts=int(self.cfg.max_retries) + 1)


# Search-R1's metric names (``protocol/metric_keys.py``: AGENT_SEARCHES, AGENT_SEARCH_FAILURE_RATE)
SEARCH_METRICS = ToolMetricNames(
    calls="searches", failures="search_failures", latency_s="search_latency_s", failure_rate="search_failure_rate"
)


class TextSearch(Tool):
    """Search-R1's `<search> query </search>`: the retrieved passages in ``tools.search.observation_format``, or the
    failure text. ``search(query)`` gives the client's raw result (MMSearch-R1 renders it itself)."""

    name = "search"
    instruction = "If I want to search, I should put the query between <search> and </search>."
    metric_names_override = SEARCH_METRICS
    config_class = SearchToolConfig

    def __init__(self, client: SearchTool, observation_format: str = SEARCHR1_STYLE):
        self.client = client
        self.observation_format = observation_format

    @classmethod
    def from_config(cls, cfg: Any, context: ToolContext) -> "TextSearch":
        search_cfg = cls.settings(cfg)
        if context.search_server_addr is not None:  # a server started by the launcher for this run
            search_cfg = replace(search_cfg, server_addr=context.search_server_addr)
        client = SearchTool(search_cfg, seed=context.seed, node_ip=context.node_ip, home_ip=context.launcher_ip)
        return cls(client, str(search_cfg.observation_format))

    async def search(self, query: str) -> SearchResult:
        return await self.client.search(query)

    async def __call__(self, content: str) -> ToolOutput:
        found = await self.client.search(content)
        body = (
            format_documents(found.documents, self.observation_format) if found.ok else search_failed_text(found.error)
        )
        return ToolOutput(body=body, ok=found.ok, latency_s=found.latency_s, error=found.error)
