"""One aiohttp session per process (per running event loop: an aiohttp session cannot cross loops)."""

from __future__ import annotations

import asyncio
import weakref

import aiohttp

_SESSIONS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession]" = weakref.WeakKeyDictionary()


def get_http_session() -> aiohttp.ClientSession:
    """The shared session of the running loop; created on first use. Connection limits are enforced by the
    search tool's own in-flight cap, so the connector itself is unlimited."""
    loop = asyncio.get_running_loop()
    session = _SESSIONS.get(loop)
    if session is None or session.closed:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        _SESSIONS[loop] = session
    return session


async def close_http_session() -> None:
    """Close the running loop's session (call before the loop ends to avoid 'Unclosed client session')."""
    session = _SESSIONS.pop(asyncio.get_running_loop(), None)
    if session is not None and not session.closed:
        await session.close()
