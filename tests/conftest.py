"""Shared fixtures. Tiny assets are generated once per test session, offline, by the repo's own code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    """The offline tiny assets (docs/contracts.md §1), generated once per session.

    Set RLINF_EXT_TINY_ASSETS=DIR to reuse a directory across runs while developing.
    """
    from rlinf_ext.assets.tiny import make_tiny_assets

    cached = os.environ.get("RLINF_EXT_TINY_ASSETS")
    out = Path(cached) if cached else tmp_path_factory.mktemp("tiny_assets")
    return make_tiny_assets(out, seed=0)


@pytest.fixture(scope="session")
def tiny_assets_sft(tiny_assets):
    """`tiny_assets` plus the warm-started `models/qwen2-tiny-sft` (trained once per session, ~5-7 min on 2 cores;
    reused from RLINF_EXT_TINY_ASSETS when that directory already has it)."""
    from rlinf_ext.assets.tiny import make_tiny_assets

    return make_tiny_assets(tiny_assets.root, seed=0, with_sft=True)
