"""Stand-ins for RLinf's point-to-point work handles (``Worker.send``/``recv`` with ``async_op=True`` return an
``AsyncCollWork``), shared by the engine weight-transfer tests; each method is checked against RLinf 0.3.0's own
(tests/support/signature_checks.py)."""

from __future__ import annotations

import queue

from rlinf.scheduler.collective.async_work import AsyncCollWork

from tests.support.signature_checks import checked_against


class Done:
    """A finished work handle holding ``value``."""

    def __init__(self, value=None):
        self.value = value

    @checked_against(AsyncCollWork.done)
    def done(self):
        return True

    @checked_against(AsyncCollWork.wait)
    def wait(self):
        return self.value

    @checked_against(AsyncCollWork.async_wait)
    async def async_wait(self):
        return self.value


class Pending:
    """An RLinf receive on the actor side: done once a message is queued."""

    def __init__(self, q: queue.Queue):
        self.q = q

    @checked_against(AsyncCollWork.done)
    def done(self):
        return not self.q.empty()

    @checked_against(AsyncCollWork.wait)
    def wait(self):
        return self.q.get_nowait()


class Op:
    """An async work handle awaiting ``coro``."""

    def __init__(self, coro=None):
        self.coro = coro

    @checked_against(AsyncCollWork.async_wait)
    async def async_wait(self):
        return await self.coro if self.coro is not None else None
