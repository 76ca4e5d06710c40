"""The tool ledger (``tools/ledger.py``): each call charged once, to the request whose coroutines made it."""

from __future__ import annotations

import asyncio

from rlinf_ext.tools.base import Tool, ToolOutput
from rlinf_ext.tools.config import SearchToolConfig
from rlinf_ext.tools.ledger import tool_ledger
from rlinf_ext.tools.search import SearchTool, TextSearch
from tests.support.latency_tool import Lookup


class Relay(Tool):
    """A tool that answers through another tool's ``run``."""

    name = "relay"

    def __init__(self, inner: Tool):
        self.inner = inner

    async def __call__(self, content: str) -> ToolOutput:
        return await self.inner.run(content)


def charged(make_calls) -> float:
    """The seconds a ledger opened around ``make_calls()`` was charged."""

    async def go():
        with tool_ledger() as ledger:
            await make_calls()
        return ledger.seconds

    return asyncio.run(go())


def test_the_tasks_started_inside_a_ledger_charge_it():
    lookup = Lookup()
    assert charged(lambda: asyncio.gather(lookup.run("0.25"), lookup.run("0.5"), lookup.run("2.0"))) == 2.75


def test_two_ledgers_open_at_once_each_get_their_own_calls():
    lookup = Lookup()

    async def request(latencies: list[str], both_open: asyncio.Barrier) -> float:
        with tool_ledger() as ledger:
            await both_open.wait()
            await asyncio.gather(*(lookup.run(x) for x in latencies))
            await both_open.wait()  # the other request's calls are done too
        return ledger.seconds

    async def go():
        both_open = asyncio.Barrier(2)
        return await asyncio.gather(request(["0.25", "0.5"], both_open), request(["1.0"], both_open))

    assert asyncio.run(go()) == [0.75, 1.0]


def test_a_text_search_through_run_is_charged_once_by_its_client():
    search = TextSearch(SearchTool(SearchToolConfig(backend="dummy", topk=2)))
    seconds = charged(lambda: search.run("eiffel tower"))
    [latency] = search.client.stats.latencies_s
    assert seconds == latency and search.stats.latencies_s == [latency]  # not 2 * latency


def test_a_tool_answering_through_another_tools_run_is_charged_once():
    assert charged(lambda: Relay(Lookup()).run("0.5")) == 0.5  # not 1.0


def test_calls_outside_a_ledger_charge_nothing():
    lookup = Lookup()
    asyncio.run(lookup.run("3.0"))  # evaluation and benchmarks call tools without a ledger
    assert charged(lambda: lookup.run("0.25")) == 0.25 and lookup.stats.latencies_s == [3.0, 0.25]
