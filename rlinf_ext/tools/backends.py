"""Search backends: local retrieval server over HTTP, optional web search, deterministic dummy.

A backend does one attempt: `await backend.search(query, topk, timeout, url)` -> list[Document]. It raises
`RetryableSearchError` for connection errors, timeouts and 5xx, `SearchRequestError` for anything a retry
cannot fix (4xx, malformed response). Retries, rate limit and in-flight cap live in `SearchTool`.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
from typing import Any

import aiohttp

from rlinf_ext.tools.documents import Document, parse_retrieve_response
from rlinf_ext.tools.http_session import get_http_session


class SearchRequestError(Exception):
    """A failed search attempt that retrying will not fix (4xx, bad response)."""


class RetryableSearchError(Exception):
    """A failed search attempt worth retrying (connection error, timeout, 5xx)."""


class LocalBackend:
    """POST {url}/retrieve with `return_scores: true`; both response shapes are accepted."""

    needs_server = True

    async def search(self, query: str, topk: int, timeout: float, url: str) -> list[Document]:
        body = {"queries": [query], "topk": topk, "return_scores": True}
        try:
            async with get_http_session().post(
                f"{url}/retrieve", json=body, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                if response.status >= 500:
                    raise RetryableSearchError(f"HTTP {response.status} from {url}")
                if response.status >= 400:
                    detail = (await response.text())[:200]
                    raise SearchRequestError(f"HTTP {response.status} from {url}: {detail}")
                payload = await response.json(content_type=None)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise RetryableSearchError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from exc
        except asyncio.TimeoutError as exc:
            raise RetryableSearchError(f"timeout after {timeout:g}s from {url}") from exc
        try:
            return parse_retrieve_response(payload, expected_queries=1)[0]
        except ValueError as exc:
            raise SearchRequestError(str(exc)) from exc


class DummyBackend:
    """Deterministic canned documents derived from the query (engine- and server-free tests)."""

    needs_server = False

    async def search(self, query: str, topk: int, timeout: float, url: str | None) -> list[Document]:
        digest = hashlib.sha1(query.encode("utf-8")).hexdigest()[:8]
        return [
            Document(
                title=f"Dummy {digest} {k + 1}",
                text=f"Canned passage {k + 1} about {query.strip()}.",
                url=f"https://example.invalid/{digest}/{k + 1}",
                score=1.0 / (k + 1),
                doc_id=f"{digest}-{k + 1}",
            )
            for k in range(topk)
        ]


class WebBackend:
    """Web search through the optional `ddgs` package (DuckDuckGo and other engines; off by default, needs
    network). Not a project dependency: `pip install ddgs` where web search is wanted."""

    needs_server = False
    PACKAGE = "ddgs"

    def __init__(self) -> None:
        try:
            self._module = importlib.import_module(self.PACKAGE)
        except ImportError as exc:
            raise ImportError(
                f"tools.search.backend=web needs the optional package '{self.PACKAGE}' (pip install ddgs), "
                "or use backend: local with a retrieval server"
            ) from exc

    async def search(self, query: str, topk: int, timeout: float, url: str | None) -> list[Document]:
        def run() -> list[dict[str, Any]]:
            return list(self._module.DDGS(timeout=timeout).text(query, max_results=topk) or [])

        try:
            rows = await asyncio.wait_for(asyncio.to_thread(run), timeout)
        except asyncio.TimeoutError as exc:
            raise RetryableSearchError(f"web search timeout after {timeout:g}s") from exc
        except Exception as exc:  # the package raises its own exception types for rate limits / network
            raise RetryableSearchError(f"web search failed: {type(exc).__name__}: {exc}") from exc
        return [
            Document(title=str(r.get("title", "")), text=str(r.get("body", "")), url=r.get("href")) for r in rows[:topk]
        ]


def make_backend(name: str):
    if name == "local":
        return LocalBackend()
    if name == "dummy":
        return DummyBackend()
    if name == "web":
        return WebBackend()
    raise ValueError(f"tools.search.backend must be local, web or dummy, got {name!r}")
