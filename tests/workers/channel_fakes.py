"""Stand-ins for RLinf's channel and its async work handles, shared by the rollout workers' serving-loop tests; each
method is checked against RLinf 0.3.0's own (``Channel.get``/``put``, ``AsyncChannelWork.async_wait``), and a call
without ``async_op=True`` answers as RLinf does (the item itself, no work handle)."""

from __future__ import annotations

import asyncio

from rlinf.scheduler import Channel as RLinfChannel
from rlinf.scheduler.collective.async_work import AsyncChannelWork

from tests.support.signature_checks import checked_against


class Op:
    """An RLinf async work handle: ``async_wait`` gives ``value``, or awaits ``coro``."""

    def __init__(self, value=None, coro=None):
        self.value, self.coro = value, coro

    @checked_against(AsyncChannelWork.async_wait)
    async def async_wait(self):
        return await self.coro if self.coro is not None else self.value


class Channel:
    """An RLinf channel: ``get`` takes from ``queue``; ``put`` records the item under its key (async only: the
    serving loops' calls)."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.items: dict = {}

    @checked_against(RLinfChannel.get)
    def get(self, key="default_queue", async_op=False):
        if not async_op:
            raise AssertionError("a blocking Channel.get inside the async serving loop")
        return Op(coro=self.queue.get())

    @checked_against(RLinfChannel.put)
    def put(self, item, weight=0, key="default_queue", async_op=False):
        if not async_op:
            raise AssertionError("a blocking Channel.put inside the async serving loop")
        self.items[key] = item
        return Op()


class KeyedChannel:
    """An RLinf channel whose ``get(key)`` waits for a ``put`` under that key: the generate channels between the
    agent loop (``ChannelGenerator``) and a rollout worker's serving loop. ``log``: every put, in order, as
    ``("put", key)``, shared with the test's other events."""

    def __init__(self, log: list | None = None):
        self.queues: dict = {}
        self.log = log if log is not None else []

    def _queue(self, key) -> asyncio.Queue:
        return self.queues.setdefault(key, asyncio.Queue())

    @checked_against(RLinfChannel.get)
    def get(self, key="default_queue", async_op=False):
        if not async_op:
            raise AssertionError("a blocking Channel.get inside the async serving loop")
        return Op(coro=self._queue(key).get())

    @checked_against(RLinfChannel.put)
    def put(self, item, weight=0, key="default_queue", async_op=False):
        if not async_op:
            raise AssertionError("a blocking Channel.put inside the async serving loop")
        self.log.append(("put", key))
        self._queue(key).put_nowait(item)
        return Op()
