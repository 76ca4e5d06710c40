"""`tools.search` settings: the schema's own section class (defaults live only in ``config/schema.py``), and the
checks the client runs on it before the first request."""

from __future__ import annotations

import typing

from rlinf_ext.config.schema import SearchToolConfig

BACKENDS: tuple[str, ...] = typing.get_args(typing.get_type_hints(SearchToolConfig)["backend"])


def check_search_config(cfg: SearchToolConfig) -> None:
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
