"""Whole trajectories against a failing server: the loop finishes, failures are counted, nothing hangs."""

import asyncio
import time

import pytest
from retrieval_stub import StubBehaviour, StubServer, unused_port

from rlinf_ext.agent.searchr1.config import LoopSettings
from rlinf_ext.agent.searchr1.loop import run_group, summarize_metrics
from rlinf_ext.tools import SearchError, SearchTool, SearchToolConfig, close_http_session
from rlinf_ext.tools.search import TextSearch
from tests.support.scripted import CharTokenizer, ScriptedGenerator

TOK = CharTokenizer()


def scripted():
    return ScriptedGenerator(
        lambda k, context: "<answer>x</answer>" if "<information>" in context else "<search> q </search>"
    )


def run_groups(cfg, group_size=4):
    async def go():
        tool = SearchTool(cfg, seed=0)
        try:
            started = time.monotonic()
            trajs = await run_group(
                scripted(), TOK, TOK.encode("Q?"), ["x"], LoopSettings(max_turns=2), [TextSearch(tool)], group_size
            )
            return tool, trajs, time.monotonic() - started
        finally:
            await close_http_session()

    return asyncio.run(go())


@pytest.mark.timeout(30)
def test_server_down_trajectories_finish_with_failure_observation():
    cfg = SearchToolConfig(
        server_addr=f"127.0.0.1:{unused_port()}", default_timeout=1.0, max_retries=2, backoff_base=0.05
    )
    tool, trajs, elapsed = run_groups(cfg)
    assert all(t.end_reason == "answer" for t in trajs)
    assert all("The search failed" in TOK.decode(t.turns[0].observation_ids) for t in trajs)
    assert summarize_metrics(trajs)["agent/search_failures"] == 1.0
    assert summarize_metrics(trajs, [TextSearch])["agent/search_failure_rate"] == 1.0
    assert tool.stats.failures == 4 and tool.stats.attempts == 4 * 3
    assert elapsed < tool.max_call_seconds + 1.0


@pytest.mark.timeout(30)
def test_slow_server_trajectories_bounded():
    with StubServer(StubBehaviour(delay_s=5.0)) as server:
        cfg = SearchToolConfig(server_addr=server.url, default_timeout=0.2, max_retries=1, backoff_base=0.05)
        tool, trajs, elapsed = run_groups(cfg)
    assert all(t.metrics["search_failures"] == 1 for t in trajs)
    assert elapsed < 5.0  # the 5 s server delay was never waited for


@pytest.mark.timeout(30)
def test_fail_on_search_error_stops_the_run():
    with StubServer(StubBehaviour(status=500)) as server:
        cfg = SearchToolConfig(
            server_addr=server.url, default_timeout=1.0, max_retries=1, backoff_base=0.01, fail_on_search_error=True
        )
        with pytest.raises(SearchError):
            run_groups(cfg)
