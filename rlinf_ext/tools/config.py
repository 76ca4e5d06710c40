"""`tools.search`: the text search tool's settings (``TextSearch.config_class``), and the one place their values are
checked (``problems``: ``validate`` reports them by key, the client refuses them when built in code)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Optional

from rlinf_ext.config.schema import fld
from rlinf_ext.tools.base import SettingProblem


@dataclass
class SearchToolConfig:
    backend: Literal["local", "web", "dummy"] = fld(
        "local",
        "Text search engine: local = the retrieval server over HTTP (BM25/dense); web = the internet "
        "through the optional ddgs package (pip install ddgs; off by default); dummy = canned passages (tests).",
    )
    server_addr: Any = fld(
        None, "host:port, a list of them, or a directory of address files; null = the server launched by retrieval."
    )
    topk: int = fld(3, "Passages returned per query.")
    num_workers: int = fld(8, "Concurrent search requests.")
    rate_limit: Optional[float] = fld(None, "Requests per second at most (null = unlimited).")
    default_timeout: float = fld(60.0, "Seconds before a search request times out.")
    max_retries: int = fld(3, "Retries on connection errors / 5xx.")
    backoff_base: float = fld(0.5, "Seconds; retry k waits backoff_base * 2**k.")
    fail_on_search_error: bool = fld(False, "Abort the step on a failed search (False: insert an error text).")
    observation_format: Literal["searchr1", "rlinf"] = fld("searchr1", "How retrieved passages are rendered.")

    def problems(self) -> Iterator[SettingProblem]:
        """Values the client cannot work with (the server address is checked where it is resolved, since the
        launcher may fill it: ``tools/addresses.py``)."""
        lower_bounds = (("topk", 1, 3), ("num_workers", 1, 8), ("max_retries", 0, 3))
        for key, least, example in lower_bounds:
            if int(getattr(self, key)) < least:
                yield SettingProblem(
                    key, f"must be >= {least}, got {getattr(self, key)}.", f"set tools.search.{key}={example}."
                )
        if self.rate_limit is not None and float(self.rate_limit) < 0:
            yield SettingProblem(
                "rate_limit",
                f"must be >= 0 requests per second, got {self.rate_limit}.",
                "set tools.search.rate_limit=null (unlimited) or a positive rate.",
            )
        if float(self.default_timeout) <= 0:
            yield SettingProblem(
                "default_timeout",
                f"must be > 0 seconds, got {self.default_timeout}.",
                "set tools.search.default_timeout=60.",
            )
        if float(self.backoff_base) < 0:
            yield SettingProblem(
                "backoff_base", f"must be >= 0 seconds, got {self.backoff_base}.", "set tools.search.backoff_base=0.5."
            )
