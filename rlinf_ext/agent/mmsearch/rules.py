"""MMSearch-R1's own config rules (``AgentSpec.rules``): its search limits fit its rounds, its image search has
a source, its image pixel bounds hold a 28x28 block. They run only on configs whose agent is mmsearch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlinf_ext.config.rule_registry import rule
from rlinf_ext.config.structure import ConfigIssue
from rlinf_ext.protocol.agents import MMSEARCH


@rule(
    "agentloop.mmsearch.max_gen_round",
    "agentloop.mmsearch.image_search_limit",
    "agentloop.mmsearch.text_search_limit",
    agent=MMSEARCH,
)
def search_limits_fit_the_rounds(cfg: Any) -> Iterator[ConfigIssue]:
    """Each search takes a round and the answer needs one more: a limit at or above max_gen_round is unreachable."""
    mm = cfg.agentloop.mmsearch
    if mm.max_gen_round < 1:
        return
    for key, limit in (("image_search_limit", mm.image_search_limit), ("text_search_limit", mm.text_search_limit)):
        if limit < 0 or limit > mm.max_gen_round - 1:
            yield ConfigIssue(
                f"agentloop.mmsearch.{key}",
                f"{limit} searches cannot fit max_gen_round="
                f"{mm.max_gen_round} (each search takes a round, the answer one more).",
                f"set agentloop.mmsearch.{key} between 0 and {max(mm.max_gen_round - 1, 0)}.",
            )


@rule("tools.image_search.backend", "tools.image_search.cache_path", "agentloop.mmsearch.max_gen_round", agent=MMSEARCH)
def image_search_source(cfg: Any) -> Iterator[ConfigIssue]:
    if cfg.tools.image_search.backend != "dummy" and not cfg.tools.image_search.cache_path:
        yield ConfigIssue(
            "tools.image_search.cache_path",
            f"backend {cfg.tools.image_search.backend} reads a cache, but no path is set.",
            "set tools.image_search.cache_path=DIR (FVQA_Cache) or FILE.pkl.",
        )
    if cfg.agentloop.mmsearch.max_gen_round < 1:
        yield ConfigIssue(
            "agentloop.mmsearch.max_gen_round", "must be >= 1.", "set agentloop.mmsearch.max_gen_round=3."
        )


@rule(
    "agentloop.mmsearch.image_min_pixels",
    "agentloop.mmsearch.image_max_pixels",
    "tools.image_search.thumbnail_min_pixels",
    "tools.image_search.thumbnail_max_pixels",
    agent=MMSEARCH,
)
def image_pixel_bounds(cfg: Any) -> Iterator[ConfigIssue]:
    """Qwen2.5-VL merges 28x28 pixels into one token: a smaller bound leaves no token; max below min is empty."""
    mm, thumbs = cfg.agentloop.mmsearch, cfg.tools.image_search
    for lo_key, hi_key, lo, hi in (
        (
            "agentloop.mmsearch.image_min_pixels",
            "agentloop.mmsearch.image_max_pixels",
            mm.image_min_pixels,
            mm.image_max_pixels,
        ),
        (
            "tools.image_search.thumbnail_min_pixels",
            "tools.image_search.thumbnail_max_pixels",
            thumbs.thumbnail_min_pixels,
            thumbs.thumbnail_max_pixels,
        ),
    ):
        if lo < 28 * 28:
            yield ConfigIssue(lo_key, f"{lo} pixels is below one 28x28 block (784).", f"set {lo_key}>=784.")
        elif hi < lo:
            yield ConfigIssue(hi_key, f"{hi} is below {lo_key}={lo}.", f"set {hi_key}>={lo}.")
