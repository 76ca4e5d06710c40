"""`tools.search` settings as a dataclass (the typed experiment schema has the same names and help)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BACKENDS = ("local", "web", "dummy")


@dataclass
class SearchToolConfig:
    backend: str = "local"  # local (HTTP /retrieve) | web (optional package) | dummy (canned docs)
    server_addr: Any = None  # "host:port" | ["host:port", ...] | a directory/file written by --save-address-to
    topk: int = 3
    num_workers: int = 64  # maximum requests in flight per process
    rate_limit: float | None = None  # requests per second for the whole process; None/0 = unlimited
    default_timeout: float = 30.0  # seconds per HTTP attempt
    max_retries: int = 3  # retries after the first attempt (connection errors, timeouts, 5xx only)
    backoff_base: float = 0.5  # seconds; attempt k waits backoff_base * 2**k * jitter(0.5..1.5), capped
    fail_on_search_error: bool = False  # raise instead of inserting a "search failed" observation


def check_search_config(cfg: Any) -> None:
    """Raise ValueError naming the key and the fix for values the client cannot work with."""
    if cfg.backend not in BACKENDS:
        raise ValueError(f"tools.search.backend must be one of {BACKENDS}, got {cfg.backend!r}")
    if cfg.backend == "local" and not cfg.server_addr:
        raise ValueError(
            "tools.search.server_addr is empty: set it to 'host:port', a list of them, or the address "
            "directory given to `rlinf-ext serve-retriever --save-address-to`"
        )
    if int(cfg.topk) < 1:
        raise ValueError(f"tools.search.topk must be >= 1, got {cfg.topk}")
    if int(cfg.num_workers) < 1:
        raise ValueError(f"tools.search.num_workers must be >= 1, got {cfg.num_workers}")
    if cfg.rate_limit is not None and float(cfg.rate_limit) < 0:
        raise ValueError(f"tools.search.rate_limit must be >= 0 (0 or null = unlimited), got {cfg.rate_limit}")
    if float(cfg.default_timeout) <= 0:
        raise ValueError(f"tools.search.default_timeout must be > 0 seconds, got {cfg.default_timeout}")
    if int(cfg.max_retries) < 0:
        raise ValueError(f"tools.search.max_retries must be >= 0, got {cfg.max_retries}")
    if float(cfg.backoff_base) < 0:
        raise ValueError(f"tools.search.backoff_base must be >= 0, got {cfg.backoff_base}")
