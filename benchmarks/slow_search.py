"""Benchmark-only: Search-R1's text search with an added latency per call, standing in for a remote search engine
(the tiny experiment's BM25 server answers in milliseconds). A plug-in tool (``docs/extending.md``):
``agentloop.searchr1.tools=[benchmarks.slow_search:SlowSearch]`` with one of these set in every process of the run
(the launcher's environment reaches the Ray workers):

- ``RLINF_EXT_BENCH_SEARCH_LATENCY_MS=500``: the same 500 ms on every call;
- ``RLINF_EXT_BENCH_SEARCH_LATENCY=lognormal:median_ms=300,p99_ms=3000,seed=0``: a heavy tail, one draw per call
  (``fixed:ms=500`` is the first form). It wins over ``..._MS`` when both are set.

A search agent's long tail is a few slow calls among many fast ones; a lognormal with its p99 ten times its median
gives that. Its sigma follows from the ratio: p99 = median * exp(sigma * z99), so sigma = ln(p99 / median) / z99.
A draw is a pure function of (seed, the query, how many times this tool has searched that query
before), not of
the order in which concurrent calls arrive, so two runs with the same seed wait the same for the same queries.

Same name, tag and metrics as ``search``, so the runs compare."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
from collections import Counter
from dataclasses import dataclass
from statistics import NormalDist

from rlinf_ext.tools.base import ToolOutput
from rlinf_ext.tools.ledger import charge_tool_seconds
from rlinf_ext.tools.search import TextSearch

LATENCY_ENV = "RLINF_EXT_BENCH_SEARCH_LATENCY_MS"
DISTRIBUTION_ENV = "RLINF_EXT_BENCH_SEARCH_LATENCY"
Z99 = NormalDist().inv_cdf(0.99)  # 2.3263...


@dataclass(frozen=True)
class Latency:
    """A per-call search latency: ``fixed`` (``median_ms`` on every call) or ``lognormal``."""

    kind: str = "fixed"
    median_ms: float = 0.0
    p99_ms: float = 0.0
    seed: int = 0

    @property
    def sigma(self) -> float:
        return math.log(self.p99_ms / self.median_ms) / Z99 if self.kind == "lognormal" else 0.0

    def quantile_ms(self, q: float) -> float:
        """The latency that a share ``q`` of the calls stays under."""
        if self.kind == "fixed":
            return self.median_ms
        return self.median_ms * math.exp(self.sigma * NormalDist().inv_cdf(q))

    def draw_ms(self, content: str, repeat: int) -> float:
        """The latency of the ``repeat``-th call (from 0) with query ``content``: the quantile at a uniform that
        hashes (seed, repeat, content)."""
        if self.kind == "fixed":
            return self.median_ms
        digest = hashlib.sha256(f"{self.seed}\x00{repeat}\x00{content}".encode()).digest()
        u = (int.from_bytes(digest[:8], "big") + 0.5) / 2.0**64  # in (0, 1): inv_cdf refuses 0 and 1
        return self.quantile_ms(u)


def parse_latency(spec: str) -> Latency:
    """``500`` or ``fixed:ms=500``, or ``lognormal:median_ms=300,p99_ms=3000[,seed=0]``."""
    text = spec.strip()
    kind, _, params = text.partition(":")
    if kind.replace(".", "", 1).isdigit() and not params:
        return Latency("fixed", float(kind))
    try:
        values = dict(item.split("=", 1) for item in params.split(",") if item.strip())
        if kind == "fixed" and set(values) == {"ms"}:
            return Latency("fixed", float(values["ms"]))
        if kind == "lognormal" and {"median_ms", "p99_ms"} <= set(values) <= {"median_ms", "p99_ms", "seed"}:
            latency = Latency(
                "lognormal", float(values["median_ms"]), float(values["p99_ms"]), int(values.get("seed", 0))
            )
            if 0 < latency.median_ms <= latency.p99_ms:
                return latency
    except ValueError:
        pass
    raise ValueError(
        f"{DISTRIBUTION_ENV}={spec!r}: not a search latency; write a number of ms, 'fixed:ms=500' or "
        "'lognormal:median_ms=300,p99_ms=3000,seed=0' (0 < median_ms <= p99_ms)."
    )


def latency_from_env(environ=os.environ) -> Latency:
    spec = environ.get(DISTRIBUTION_ENV)
    return parse_latency(spec) if spec else Latency("fixed", float(environ.get(LATENCY_ENV, "0")))


class SlowSearch(TextSearch):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._latency = latency_from_env()  # read once: a bad setting fails at the tool's construction
        self._repeats: Counter[str] = Counter()

    async def __call__(self, content: str) -> ToolOutput:
        repeat = self._repeats[content]
        self._repeats[content] += 1
        delay = self._latency.draw_ms(content, repeat) / 1000.0
        if delay > 0:
            await asyncio.sleep(delay)
            charge_tool_seconds(
                delay
            )  # the stand-in engine's wait is tool time too (time/tool); the client charges its own
        output = await super().__call__(content)
        output.latency_s = (output.latency_s or 0.0) + delay
        return output
