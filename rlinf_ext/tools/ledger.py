"""Tool seconds charged to the request (batch) that made the calls: the agent-loop worker's ``tool_time``.

The worker opens a ledger for one request (``tool_ledger``). The ledger lives in a ``ContextVar``, and asyncio
tasks copy their context, so every call that request's coroutines make is charged to it. Another request running
on the same worker at the same time (``runner.max_staleness`` >= 1) has its own ledger. A charge made outside any
ledger (evaluation, validation, benchmarks) is dropped.

A call is charged once, where its latency is recorded: the text-search client (``SearchTool.search``) charges its
own calls; ``Tool.run`` charges a call that nothing under it charged (image search, a plug-in tool).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class ToolLedger:
    """The tool seconds of one request: the sum of its calls' latencies (concurrent calls add up)."""

    seconds: float = 0.0


@dataclass
class _Call:
    charged: bool = False


_LEDGER: ContextVar[ToolLedger | None] = ContextVar("rlinf_ext_tool_ledger", default=None)
_CALL: ContextVar[_Call | None] = ContextVar("rlinf_ext_tool_call", default=None)


def charge_tool_seconds(seconds: float) -> None:
    """Charge one finished call's latency to the request that made it (nothing outside a ``tool_ledger``)."""
    call = _CALL.get()
    if call is not None:
        call.charged = True
    ledger = _LEDGER.get()
    if ledger is not None:
        ledger.seconds += float(seconds)


@contextmanager
def tool_ledger() -> Iterator[ToolLedger]:
    """A fresh ledger for the calls made inside the block, by this coroutine and the tasks it starts."""
    ledger = ToolLedger()
    token = _LEDGER.set(ledger)
    try:
        yield ledger
    finally:
        _LEDGER.reset(token)


@contextmanager
def tool_call() -> Iterator[_Call]:
    """Around one ``Tool.run``: tells whether the tool's own code (its client) charged the call."""
    call = _Call()
    token = _CALL.set(call)
    try:
        yield call
    finally:
        _CALL.reset(token)
