"""Benchmark-only: Search-R1's text search with a fixed added latency per call, standing in for a remote search
engine (the tiny experiment's BM25 server answers in milliseconds). A plug-in tool (``docs/extending.md``):
``agentloop.searchr1.tools=[benchmarks.slow_search:SlowSearch]`` with ``RLINF_EXT_BENCH_SEARCH_LATENCY_MS`` set in
every process of the run (the launcher's environment reaches the Ray workers). Same name, tag and metrics as
``search``, so the runs compare."""

from __future__ import annotations

import asyncio
import os

from rlinf_ext.tools.base import ToolOutput
from rlinf_ext.tools.search import TextSearch

LATENCY_ENV = "RLINF_EXT_BENCH_SEARCH_LATENCY_MS"


class SlowSearch(TextSearch):
    async def __call__(self, content: str) -> ToolOutput:
        delay = float(os.environ.get(LATENCY_ENV, "0")) / 1000.0
        if delay > 0:
            await asyncio.sleep(delay)
        output = await super().__call__(content)
        output.latency_s = (output.latency_s or 0.0) + delay
        return output
