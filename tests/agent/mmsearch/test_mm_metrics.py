"""Metrics of MMSearch-R1 trajectories split by FVQA category (hand-computed)."""

from __future__ import annotations

import pytest

from rlinf_ext.agent.mmsearch.metrics import summary_by_category


def _row(category, correct, image, text, image_fail=0, text_fail=0, reward=None):
    return {
        "category": category,
        "correct": correct,
        "reward": float(correct if reward is None else reward),
        "image_searches": image,
        "text_searches": text,
        "image_search_failures": image_fail,
        "text_search_failures": text_fail,
    }


def test_split_by_category():
    rows = [
        _row("search_free", 1, 1, 0),
        _row("search_free", 1, 0, 0),
        _row("search_free", 0, 0, 0),
        _row("search_free", 1, 0, 0),
        _row("search_required", 1, 1, 1, image_fail=1),
        _row("search_required", 0, 0, 1, reward=0.1),
    ]
    m = summary_by_category(rows, prefix="rollout")
    assert m["rollout/search_free/accuracy"] == pytest.approx(0.75)
    assert m["rollout/search_free/search_ratio_image"] == pytest.approx(0.25)
    assert m["rollout/search_free/search_ratio_any"] == pytest.approx(0.25)
    assert m["rollout/search_required/accuracy"] == pytest.approx(0.5)
    assert m["rollout/search_required/reward"] == pytest.approx(0.55)
    assert m["rollout/search_required/search_ratio_mix"] == pytest.approx(0.5)
    assert m["rollout/search_required/search_ratio_text"] == pytest.approx(0.5)
    assert m["rollout/search_required/image_search_failure_ratio"] == pytest.approx(1.0)
    assert m["rollout/all/accuracy"] == pytest.approx(4 / 6)
    assert m["rollout/all/search_ratio_any"] == pytest.approx(3 / 6)
    assert summary_by_category([]) == {}
