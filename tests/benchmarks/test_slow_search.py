"""benchmarks/slow_search.py: the latency settings and the seeded per-call draw, by hand (pure functions)."""

from __future__ import annotations

import math

import pytest

from benchmarks.slow_search import (
    DISTRIBUTION_ENV,
    LATENCY_ENV,
    Latency,
    latency_from_env,
    parse_latency,
)

LONG_TAIL = Latency("lognormal", 300.0, 3000.0, seed=0)


def test_sigma_follows_from_the_p99_to_median_ratio():
    # ln(3000 / 300) / z99 = 2.302585 / 2.326348
    assert LONG_TAIL.sigma == pytest.approx(0.989785, rel=1e-5)


def test_quantiles_by_hand():
    assert LONG_TAIL.quantile_ms(0.5) == pytest.approx(300.0)
    assert LONG_TAIL.quantile_ms(0.99) == pytest.approx(3000.0)
    assert LONG_TAIL.quantile_ms(0.01) == pytest.approx(30.0)  # symmetric in log space: 300 / 10
    # z90 = 1.281552: 300 * exp(0.989785 * 1.281552) = 300 * exp(1.268455) = 300 * 3.55538
    assert LONG_TAIL.quantile_ms(0.9) == pytest.approx(1066.61, rel=1e-4)
    assert Latency("fixed", 500.0).quantile_ms(0.99) == 500.0


def test_draws_are_a_pure_function_of_seed_query_and_repeat():
    first = LONG_TAIL.draw_ms("who wrote hamlet", 0)
    assert LONG_TAIL.draw_ms("who wrote hamlet", 0) == first
    assert Latency("lognormal", 300.0, 3000.0, seed=0).draw_ms("who wrote hamlet", 0) == first
    assert LONG_TAIL.draw_ms("who wrote hamlet", 1) != first
    assert LONG_TAIL.draw_ms("who wrote macbeth", 0) != first
    assert Latency("lognormal", 300.0, 3000.0, seed=1).draw_ms("who wrote hamlet", 0) != first
    assert Latency("fixed", 500.0).draw_ms("anything", 7) == 500.0


def test_draws_follow_the_distribution():
    draws = sorted(LONG_TAIL.draw_ms(f"query {i}", 0) for i in range(20000))
    median, p99 = draws[10000], draws[19800]
    assert median == pytest.approx(300.0, rel=0.05)
    assert p99 == pytest.approx(3000.0, rel=0.15)
    assert all(d > 0 and math.isfinite(d) for d in draws)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("500", Latency("fixed", 500.0)),
        ("fixed:ms=250", Latency("fixed", 250.0)),
        ("lognormal:median_ms=300,p99_ms=3000", Latency("lognormal", 300.0, 3000.0, 0)),
        ("lognormal:median_ms=300,p99_ms=3000,seed=4", Latency("lognormal", 300.0, 3000.0, 4)),
    ],
)
def test_parse_latency(spec, expected):
    assert parse_latency(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "lognormal:median_ms=300",
        "lognormal:median_ms=3000,p99_ms=300",
        "lognormal:median_ms=0,p99_ms=3",
        "gamma:k=2",
        "fixed:ms=x",
        "lognormal:median_ms=300,p99_ms=3000,tail=9",
    ],
)
def test_parse_latency_refuses_and_names_the_fix(spec):
    with pytest.raises(ValueError, match=f"{DISTRIBUTION_ENV}=.*lognormal:median_ms=300,p99_ms=3000,seed=0"):
        parse_latency(spec)


def test_the_distribution_wins_over_the_fixed_form():
    assert latency_from_env({}) == Latency("fixed", 0.0)
    assert latency_from_env({LATENCY_ENV: "500"}) == Latency("fixed", 500.0)
    both = {LATENCY_ENV: "500", DISTRIBUTION_ENV: "lognormal:median_ms=300,p99_ms=3000,seed=2"}
    assert latency_from_env(both) == Latency("lognormal", 300.0, 3000.0, 2)


def test_the_added_wait_is_charged_as_tool_time(monkeypatch):
    """``time/tool`` counts the stand-in engine's wait: the delay is charged to the request's ledger beside what
    the search client charges for its own call (replaced here by an instant reply)."""
    import asyncio
    from collections import Counter

    from benchmarks.slow_search import SlowSearch
    from rlinf_ext.tools.base import ToolOutput
    from rlinf_ext.tools.ledger import tool_ledger
    from rlinf_ext.tools.search import TextSearch

    async def instant(self, content):
        return ToolOutput(body=content)

    monkeypatch.setattr(TextSearch, "__call__", instant)
    tool = SlowSearch.__new__(SlowSearch)
    tool._latency, tool._repeats = parse_latency("fixed:ms=40"), Counter()

    async def one_request():
        with tool_ledger() as ledger:
            await tool("q")
            await tool("q")
        return ledger.seconds

    assert asyncio.run(one_request()) == pytest.approx(0.08)
