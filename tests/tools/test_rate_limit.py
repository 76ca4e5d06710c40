"""Token bucket: hand-computed schedule, process-wide sharing, and the measured rate under 100 trajectories."""

import asyncio
import time

import pytest
from retrieval_stub import StubServer

from rlinf_ext.agent.searchr1.config import LoopSettings
from rlinf_ext.agent.searchr1.loop import run_trajectory
from rlinf_ext.tools import SearchTool, SearchToolConfig, close_http_session
from rlinf_ext.tools.rate_limit import TokenBucket, shared_token_bucket
from rlinf_ext.tools.search import TextSearch
from tests.support.scripted import CharTokenizer, ScriptedGenerator


def test_reservation_schedule_by_hand():
    bucket = TokenBucket(rate=4.0)  # one token every 0.25 s
    assert [bucket.reserve(now=10.0) for _ in range(4)] == [0.0, 0.25, 0.5, 0.75]
    # after a quiet second the bucket is back to "send now", with no accumulated burst beyond 1
    assert bucket.reserve(now=12.0) == 0.0
    assert bucket.reserve(now=12.0) == 0.25


def test_burst_allows_that_many_immediately():
    bucket = TokenBucket(rate=10.0, burst=3)
    delays = [bucket.reserve(now=0.0) for _ in range(5)]
    assert delays == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2])


def test_shared_bucket_is_process_wide_and_unlimited_is_none():
    assert shared_token_bucket(7.0) is shared_token_bucket(7.0)
    assert shared_token_bucket(None) is None and shared_token_bucket(0) is None
    a = SearchTool(SearchToolConfig(backend="dummy", rate_limit=7.0))
    b = SearchTool(SearchToolConfig(backend="dummy", rate_limit=7.0))
    assert a._bucket is b._bucket
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=0)


@pytest.mark.timeout(60)
def test_100_concurrent_trajectories_stay_at_configured_rate():
    rate = 40.0
    tokenizer = CharTokenizer()
    generator = ScriptedGenerator(
        lambda k, context: "<answer>x</answer>" if "<information>" in context else "<search> q </search>"
    )
    agent_cfg = LoopSettings(max_turns=2, response_length_total=4000)
    with StubServer() as server:
        cfg = SearchToolConfig(
            backend="local",
            server_addr=server.url,
            rate_limit=rate,
            num_workers=100,
            default_timeout=10.0,
            max_retries=0,
        )

        async def go():
            nonlocal started
            started = time.monotonic()  # the stub server stamps arrivals with the same clock
            tool = TextSearch(SearchTool(cfg))
            try:
                return await asyncio.gather(
                    *(
                        run_trajectory(generator, tokenizer, tokenizer.encode(f"Q{i}?"), ["x"], agent_cfg, [tool])
                        for i in range(100)
                    )
                )
            finally:
                await close_http_session()

        started = 0.0
        trajectories = asyncio.run(go())
        arrivals = sorted(server.behaviour.arrivals)
    assert len(trajectories) == 100 and all(t.end_reason == "answer" for t in trajectories)
    assert len(arrivals) == 100
    # The limiter schedules the 100th request 99 intervals after the first reservation, so the last arrival cannot
    # come sooner however the machine is loaded; it comes about then unless the loop was starved. (The span between
    # the first and last arrivals is no measure: a starved server stamps a late first arrival, and the span shrinks.)
    schedule = (len(arrivals) - 1) / rate
    elapsed = arrivals[-1] - started
    print(f"configured {rate}/s: the last of 100 requests arrived after {elapsed:.2f} s (schedule {schedule:.2f} s)")
    assert schedule * 0.98 <= elapsed <= schedule * 2 + 1.0
    # no two-second window holds much more than 2 x rate. Two seconds, not one: on a loaded 2-core machine the
    # stub server's event loop is starved now and then and stamps a queue of arrivals at once (52 in one second
    # was seen once at 40/s); without a limiter all 100 requests land within a fraction of a second.
    window = 2.0
    for i, t in enumerate(arrivals):
        in_window = sum(1 for u in arrivals[i:] if u < t + window)
        assert in_window <= rate * window * 1.2 + 2
