"""Stand-ins for RLinf's point-to-point work handles, shared by the engine weight-transfer tests."""

from __future__ import annotations

import queue


class Done:
    """A finished work handle holding ``value``."""

    def __init__(self, value=None):
        self.value = value

    def done(self):
        return True

    def wait(self):
        return self.value


class Pending:
    """An RLinf receive on the actor side: done once a message is queued."""

    def __init__(self, q: queue.Queue):
        self.q = q

    def done(self):
        return not self.q.empty()

    def wait(self):
        return self.q.get_nowait()


class Op:
    """An async work handle awaiting ``coro``."""

    def __init__(self, coro=None):
        self.coro = coro

    async def async_wait(self):
        return await self.coro if self.coro is not None else None
