"""Fixtures of the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vl_world(tiny_mm_assets_sft):
    """(mm assets, sampled multimodal trajectories of the warm-started tiny VL model), shared by the VL actor tests."""
    from fsdp_policy_helpers import mm_trajectories

    mm = tiny_mm_assets_sft.mm
    return mm, mm_trajectories(mm, mm.qwen2_5_vl_tiny_sft)
