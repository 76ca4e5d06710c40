"""Fixtures for the Megatron-core model tests: the tiny Qwen2 models with every weight randomised
(``randomized_qwen2`` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", params=["tied", "untied"])
def qwen2_pair(request, tiny_assets, randomized_qwen2):
    """(tie mode, randomised HF Qwen2ForCausalLM)."""
    model_dir = tiny_assets.qwen2_tiny if request.param == "tied" else tiny_assets.qwen2_tiny_untied
    return request.param, randomized_qwen2(model_dir)
