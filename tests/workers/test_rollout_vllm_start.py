"""The vLLM rollout worker's start-up and sync bookkeeping without an engine: the ranks' parts become
``time/rollout_start/<part>`` and ``time/sync/<part>`` metrics (max over ranks), and the tiny-experiment benchmark
prints the start-up parts and the sync of every step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner.trainer import part_metrics

REPO = Path(__file__).resolve().parents[2]


def test_start_and_sync_parts_become_metrics_max_over_ranks():
    ranks = [{"import": 7.5, "engine": 3.0}, {"import": 6.0, "engine": 3.5, "tokenizer": 0.25}, None]
    assert part_metrics(ranks, mk.TIME_ROLLOUT_START) == {
        "time/rollout_start/import": 7.5,
        "time/rollout_start/engine": 3.5,
        "time/rollout_start/tokenizer": 0.25,
    }
    assert part_metrics([None, None], mk.TIME_ROLLOUT_START) == {}  # the HF worker returns nothing
    assert part_metrics([{"load": 0.5, "probe": 0.125}], mk.TIME_SYNC) == {
        "time/sync/load": 0.5,
        "time/sync/probe": 0.125,
    }


def load_bench():
    spec = importlib.util.spec_from_file_location(
        "tiny_experiment_bench", REPO / "benchmarks" / "tiny_experiment_bench.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_prints_start_parts_and_sync_per_step():
    bench = load_bench()
    first = {
        "step": 0,
        mk.VAL_ALL_EM: 0.0,
        mk.VAL_N: 14,
        mk.TIME_ROLLOUT_START: 12.0,
        "time/rollout_start/import": 8.0,
        "time/rollout_start/engine": 3.5,
    }
    steps = [{"step": s, mk.REWARD_MEAN: 0.1 * s, mk.TIME_ROLLOUT: 2.0, mk.TIME_STEP: 5.0} for s in (1, 2, 3)]
    steps[1][mk.TIME_SYNC], steps[2][mk.TIME_SYNC] = 0.25, 0.75  # step 1 skipped its sync (validation did it)
    vllm = bench.run_figures([first, *steps], wall_s=100.0)
    assert vllm["start_parts"] == {"import": 8.0, "engine": 3.5}
    assert vllm["sync_per_step"] == [0.25, 0.75] and vllm["sync_s"] == pytest.approx(0.5)
    hf = bench.run_figures(
        [{**{k: v for k, v in first.items() if "/rollout_start/" not in k}, mk.TIME_ROLLOUT_START: 2.0}, *steps],
        wall_s=90.0,
    )
    assert hf["start_parts"] == {}
    table = bench.side_by_side({"vllm": vllm, "hf": hf})
    assert "start-up: import (s)" in table and "start-up: engine (s)" in table
    row = next(line for line in table.splitlines() if "start-up: import" in line).split()
    assert row[-2:] == ["8.0", "nan"]
