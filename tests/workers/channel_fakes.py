"""Stand-ins for RLinf's channel and its async work handles, shared by the rollout workers' serving-loop tests."""

from __future__ import annotations

import asyncio


class Op:
    """An RLinf async work handle: ``async_wait`` gives ``value``, or awaits ``coro``."""

    def __init__(self, value=None, coro=None):
        self.value, self.coro = value, coro

    async def async_wait(self):
        return await self.coro if self.coro is not None else self.value


class Channel:
    """An RLinf channel: ``get`` takes from ``queue``; ``put`` records the item under its key."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.items: dict = {}

    def get(self, async_op=True):
        return Op(coro=self.queue.get())

    def put(self, item, key=None, async_op=True):
        self.items[key] = item
        return Op()
