"""Search client against a real local HTTP server: results, faults, retries, bounds, several servers."""

import asyncio
import sys
import time
import types

import pytest
from retrieval_stub import StubBehaviour, StubServer, unused_port

from rlinf_ext.tools import SearchError, SearchTool, SearchToolConfig, close_http_session
from rlinf_ext.tools.addresses import resolve_server_urls
from rlinf_ext.tools.search import backoff_delay


def search_once(cfg, query="eiffel tower"):
    async def go():
        tool = SearchTool(cfg, seed=0)
        try:
            started = time.monotonic()
            result = await tool.search(query)
            return tool, result, time.monotonic() - started
        finally:
            await close_http_session()

    return asyncio.run(go())


def cfg_for(url, **kw):
    base = dict(backend="local", server_addr=url, topk=2, default_timeout=2.0, max_retries=2, backoff_base=0.05)
    base.update(kw)
    return SearchToolConfig(**base)


@pytest.mark.timeout(30)
def test_success_parses_scored_documents():
    with StubServer() as server:
        tool, result, _ = search_once(cfg_for(server.url))
    assert result.ok and result.attempts == 1
    assert [d.title for d in result.documents] == ["Title 0", "Title 1"]
    assert result.documents[0].text == "Passage 0 about eiffel tower."
    assert result.documents[1].score == pytest.approx(0.9)
    assert result.documents[0].url == "https://en.wikipedia.org/wiki/T0"
    assert tool.stats.calls == 1 and tool.stats.failures == 0


@pytest.mark.timeout(30)
def test_server_down_fails_after_bounded_retries():
    cfg = cfg_for(f"127.0.0.1:{unused_port()}", max_retries=2)
    tool, result, elapsed = search_once(cfg)
    assert not result.ok and result.attempts == 3
    assert "cannot reach" in result.error
    assert tool.stats.failures == 1 and tool.stats.retries == 2
    assert elapsed < tool.max_call_seconds + 1.0  # bounded: no hang (slack for scheduling on a loaded machine)


@pytest.mark.timeout(30)
def test_slow_server_times_out_per_attempt():
    with StubServer(StubBehaviour(delay_s=3.0)) as server:
        cfg = cfg_for(server.url, default_timeout=0.3, max_retries=1)
        tool, result, elapsed = search_once(cfg)
        seen = len(server.behaviour.arrivals)
    assert not result.ok and result.attempts == 2 and seen == 2
    assert "timeout" in result.error
    # two 0.3 s attempts plus one backoff (+ scheduling slack); far below the server's 3 s delay
    assert tool.max_call_seconds < 1.0 and elapsed < tool.max_call_seconds + 1.0  # still < the 3 s delay


@pytest.mark.timeout(30)
def test_500s_then_success_is_retried():
    with StubServer(StubBehaviour(fail_first=2)) as server:
        tool, result, _ = search_once(cfg_for(server.url, max_retries=3))
        seen = len(server.behaviour.arrivals)
    assert result.ok and result.attempts == 3 and seen == 3
    assert tool.stats.retries == 2 and tool.stats.failures == 0


@pytest.mark.timeout(30)
def test_500s_beyond_retries_fail():
    with StubServer(StubBehaviour(fail_first=10)) as server:
        tool, result, _ = search_once(cfg_for(server.url, max_retries=2))
        seen = len(server.behaviour.arrivals)
    assert not result.ok and seen == 3 and "HTTP 500" in result.error


@pytest.mark.timeout(30)
def test_4xx_is_not_retried():
    with StubServer(StubBehaviour(status=422)) as server:
        tool, result, _ = search_once(cfg_for(server.url, max_retries=3))
        seen = len(server.behaviour.arrivals)
    assert not result.ok and result.attempts == 1 and seen == 1
    assert "HTTP 422" in result.error and tool.stats.failures == 1


@pytest.mark.timeout(30)
def test_fail_on_search_error_raises():
    with StubServer(StubBehaviour(status=404)) as server:
        with pytest.raises(SearchError, match="fail_on_search_error"):
            search_once(cfg_for(server.url, fail_on_search_error=True))


@pytest.mark.timeout(30)
def test_several_servers_share_load_and_cover_a_dead_one(tmp_path):
    with StubServer() as a, StubServer() as b:
        # an address directory as written by --save-address-to, plus a dead address in a list
        (tmp_path / "server-0.addr").write_text(f"127.0.0.1:{a.port}\n")
        (tmp_path / "server-1.addr").write_text(f'{{"host": "127.0.0.1", "port": {b.port}}}')
        assert resolve_server_urls(str(tmp_path)) == [a.url, b.url]

        async def many(cfg, n):
            tool = SearchTool(cfg, seed=0)
            try:
                return await asyncio.gather(*(tool.search(f"q{i}") for i in range(n)))
            finally:
                await close_http_session()

        results = asyncio.run(many(cfg_for(str(tmp_path)), 10))
        assert all(r.ok for r in results)
        assert len(a.behaviour.arrivals) == 5 and len(b.behaviour.arrivals) == 5

        dead = f"127.0.0.1:{unused_port()}"
        results = asyncio.run(many(cfg_for([dead, a.url], max_retries=1), 6))
        assert all(r.ok for r in results)  # a retry moves to the next server


def test_dummy_backend_is_deterministic():
    cfg = SearchToolConfig(backend="dummy", topk=3)
    _, first, _ = search_once(cfg, "who")
    _, again, _ = search_once(cfg, "who")
    assert first.ok and len(first.documents) == 3 and first.documents == again.documents


def test_web_backend_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ddgs", None)  # as if not installed (it is not a dependency)
    with pytest.raises(ImportError, match="pip install ddgs"):
        SearchTool(SearchToolConfig(backend="web"))


class _FakeDDGS:
    """The `ddgs` API surface the web backend uses: DDGS(timeout=...).text(query, max_results=...)."""

    queries: list = []

    def __init__(self, timeout=None):
        self.timeout = timeout

    def text(self, query, max_results=10):
        self.queries.append((query, max_results, self.timeout))
        return [
            {"title": f"Web {k}", "href": f"https://web.invalid/{k}", "body": f"About {query} ({k})."} for k in range(5)
        ][:max_results]


@pytest.mark.timeout(30)
def test_text_search_backend_is_a_config_switch(monkeypatch):
    """One key, tools.search.backend, picks the engine; the tool's interface and results stay the same."""
    monkeypatch.setitem(sys.modules, "ddgs", types.SimpleNamespace(DDGS=_FakeDDGS))
    with StubServer() as server:
        local = search_once(cfg_for(server.url), "drelia")[1]
    web = search_once(SearchToolConfig(backend="web", topk=2, default_timeout=5.0), "drelia")[1]
    dummy = search_once(SearchToolConfig(backend="dummy", topk=2), "drelia")[1]
    assert [d.title for d in local.documents] == ["Title 0", "Title 1"]
    assert [d.title for d in web.documents] == ["Web 0", "Web 1"] and web.documents[0].url == "https://web.invalid/0"
    assert web.documents[1].text == "About drelia (1)." and _FakeDDGS.queries[-1] == ("drelia", 2, 5.0)
    assert dummy.ok and len(dummy.documents) == 2 and dummy.documents[0].title.startswith("Dummy")


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="tools.search.server_addr"):
        SearchTool(SearchToolConfig(backend="local", server_addr=None))
    with pytest.raises(ValueError, match="tools.search.backend"):
        SearchTool(SearchToolConfig(backend="bing"))
    with pytest.raises(ValueError, match="does not exist"):
        resolve_server_urls(str(tmp_path / "missing" / "dir"))
    with pytest.raises(ValueError, match="no retrieval server address"):
        resolve_server_urls(str(tmp_path))  # empty directory


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("topk", 0, ">= 1"),
        ("num_workers", 0, ">= 1"),
        ("max_retries", -1, ">= 0"),
        ("rate_limit", -0.5, ">= 0"),
        ("default_timeout", 0, "> 0"),
        ("backoff_base", -1, ">= 0"),
    ],
)
def test_range_checks_are_written_once_and_name_the_key(key, value, says):
    """``SearchToolConfig.problems`` is the one check: validate reports it by key, the client refuses it."""
    from rlinf_ext.config import check_config

    (issue,) = [
        i for i in check_config("tiny-cpu", [f"tools.search.{key}={value}"]).issues if i.key.startswith("tools.search.")
    ]
    assert issue.key == f"tools.search.{key}" and says in issue.reason and f"tools.search.{key}" in issue.fix
    with pytest.raises(ValueError, match=rf"tools\.search\.{key}: must be {says}"):
        SearchTool(SearchToolConfig(backend="dummy", **{key: value}))
    assert list(SearchToolConfig().problems()) == []


def test_backoff_is_exponential_with_bounded_jitter():
    import random

    rng = random.Random(0)
    for attempt in range(4):
        delay = backoff_delay(attempt, 0.5, rng)
        assert 0.5 * 0.5 * 2**attempt <= delay < 0.5 * 1.5 * 2**attempt


@pytest.mark.timeout(30)
def test_a_worker_asks_its_own_nodes_server_first_and_fails_over():
    """Per-node servers (retrieval.per_node): 127.0.0.2 stands for the worker's node, 127.0.0.1 for another."""

    async def many(tool, n):
        try:
            return await asyncio.gather(*(tool.search(f"q{i}") for i in range(n)))
        finally:
            await close_http_session()

    with StubServer() as other, StubServer(host="127.0.0.2") as own:
        tool = SearchTool(cfg_for([other.url, own.url]), seed=0, node_ip="127.0.0.2")
        assert (tool.local_urls, tool.other_urls) == ([own.url], [other.url])
        assert all(r.ok for r in asyncio.run(many(tool, 6)))
        assert len(own.behaviour.arrivals) == 6 and not other.behaviour.arrivals
        # this node's server is down: every call fails over to the other node's on its retry
        dead_own = f"http://127.0.0.2:{unused_port('127.0.0.2')}"
        tool = SearchTool(cfg_for([other.url, dead_own], max_retries=1), seed=0, node_ip="127.0.0.2")
        results = asyncio.run(many(tool, 4))
        assert all(r.ok and r.attempts == 2 for r in results)
        assert len(other.behaviour.arrivals) == 4


def test_a_worker_on_another_node_never_uses_the_launchers_loopback_address():
    loopback = SearchToolConfig(backend="local", server_addr=["127.0.0.1:8000", "localhost:8001"])
    with pytest.raises(
        ValueError,
        match=r"loopback address of node 10\.1\.2\.1.*runs on node 10\.1\.2\.3.*"
        r"retrieval\.per_node=true",
    ):
        SearchTool(loopback, node_ip="10.1.2.3", home_ip="10.1.2.1")
    mixed = SearchToolConfig(backend="local", server_addr=["127.0.0.1:8000", "10.1.2.4:8000", "10.1.2.3:8000"])
    tool = SearchTool(mixed, node_ip="10.1.2.3", home_ip="10.1.2.1")
    assert (tool.local_urls, tool.other_urls) == (["http://10.1.2.3:8000"], ["http://10.1.2.4:8000"])
    # on the launcher's node the loopback server is this node's; so on a one-machine cluster, and off a cluster
    tool = SearchTool(mixed, node_ip="10.1.2.1", home_ip="10.1.2.1")
    assert tool.local_urls == ["http://127.0.0.1:8000"] and len(tool.other_urls) == 2
    assert SearchTool(loopback, node_ip="127.0.0.2", home_ip="10.1.2.1").urls == [
        "http://127.0.0.1:8000",
        "http://localhost:8001",
    ]
    assert SearchTool(loopback).urls == ["http://127.0.0.1:8000", "http://localhost:8001"]
