"""Validation-pass helpers: when to validate, the fixed subset, flat metric names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_scoring import hand_made_records

from rlinf_ext.eval.core.validation import sample_items, should_validate
from rlinf_ext.eval.searchr1.dataset import EvalItem
from rlinf_ext.eval.searchr1.scoring import aggregate
from rlinf_ext.eval.searchr1.validation import validation_metrics


def _cfg(interval: int, before: bool, paths=("x.jsonl",)):
    return SimpleNamespace(
        runner=SimpleNamespace(val_check_interval=interval, val_before_train=before),
        data=SimpleNamespace(val_data_paths=list(paths)),
    )


def test_should_validate():
    cfg = _cfg(3, True)
    assert [s for s in range(10) if should_validate(cfg, s)] == [0, 3, 6, 9]
    assert [s for s in range(10) if should_validate(_cfg(3, False), s)] == [3, 6, 9]
    assert not any(should_validate(_cfg(-1, False), s) for s in range(10))
    assert not any(should_validate(_cfg(1, True, paths=()), s) for s in range(5))


def test_sample_is_fixed_per_seed_capped_per_benchmark_and_in_file_order():
    items = [EvalItem("nq", str(i), "", "", ["a"]) for i in range(20)] + [
        EvalItem("bamboogle", str(i), "", "", ["a"]) for i in range(3)
    ]
    a = sample_items(items, 5, seed=7)
    assert a == sample_items(items, 5, seed=7)
    assert sum(1 for it in a if it.benchmark == "nq") == 5
    assert sum(1 for it in a if it.benchmark == "bamboogle") == 3  # fewer than asked: all of them
    positions = [items.index(it) for it in a]
    assert positions == sorted(positions)
    assert sample_items(items, -1, seed=7) == items
    assert {it.item_id for it in sample_items(items, 5, seed=8) if it.benchmark == "nq"} != {
        it.item_id for it in a if it.benchmark == "nq"
    }


def test_flat_metric_names_and_values():
    m = validation_metrics(aggregate(hand_made_records()))
    assert m["val/nq/em"] == pytest.approx(1 / 3)
    assert m["val/hotpotqa/f1"] == pytest.approx(5 / 6)
    assert m["val/avg/em"] == pytest.approx(5 / 12)
    assert m["val/all/em"] == pytest.approx(2 / 5)
    assert m["val/hotpotqa/searches"] == pytest.approx(3 / 2)
    assert m["val/n"] == 5.0
    assert all(isinstance(v, float) for v in m.values())
