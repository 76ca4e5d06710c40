"""Fixtures of the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vl_world(tiny_mm_assets):
    """(mm assets, multimodal trajectories of the random tiny VL model `mm.qwen2_5_vl_tiny`), shared by the VL
    actor tests: each opens with an image search (forced: `ForcedFirstTurn`), so they hold result images, and
    samples the rest. The tests need such trajectories, not a trained model (no warm start to build)."""
    from fsdp_policy_helpers import mm_trajectories

    from rlinf_ext.agent.mmsearch.protocol import IMAGE_CALL

    mm = tiny_mm_assets.mm
    return mm, mm_trajectories(mm, mm.qwen2_5_vl_tiny, first_turn=IMAGE_CALL)
