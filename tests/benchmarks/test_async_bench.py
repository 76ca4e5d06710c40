"""benchmarks/async_bench.py: the grid, the figures of one run from its metrics rows and the tables, by hand; its
argument checks refuse before any launch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlinf_ext.protocol import metric_keys as mk
from tests.support.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]
TAIL = "lognormal:median_ms=300,p99_ms=3000"


@pytest.fixture(scope="module")
def bench():
    return load_script(REPO / "benchmarks" / "async_bench.py")


def test_grid_runs_k0_once_and_every_admission_and_partial_above(bench):
    settings = bench.grid([TAIL], [0, 1], ["batch", "group"], [False, True])
    assert [(s.k, s.admission, s.partial) for s in settings] == [
        (0, "batch", False),
        (1, "batch", False),
        (1, "batch", True),
        (1, "group", False),
        (1, "group", True),
    ]
    assert all(s.baseline == bench.Setting(TAIL, 0) for s in settings)
    assert settings[4].overrides() == [
        "runner.max_staleness=1",
        "runner.admission=group",
        "runner.partial_rollout=true",
    ]


def test_a_lognormal_without_its_seed_takes_the_runs(bench):
    assert bench.with_seed(TAIL, 3) == TAIL + ",seed=3"
    assert bench.with_seed(TAIL + ",seed=0", 3) == TAIL + ",seed=0"
    assert bench.with_seed("500", 3) == "500"


def test_parse_switch(bench):
    assert bench.parse_switch("off,on") == [False, True]
    with pytest.raises(ValueError, match="neither off nor on"):
        bench.parse_switch("off,maybe")


def row(step, reward, step_s, **extra):
    return {"step": step, mk.REWARD_MEAN: reward, mk.TIME_STEP: step_s, **extra}


def test_run_figures_by_hand(bench):
    rows = [
        {"step": 0, mk.TIME_ROLLOUT_START: 9.0},  # start-up row: not a training step
        row(
            1,
            0.25,
            4.0,
            **{mk.TIME_ACTOR_IDLE_RATIO: 0.5, mk.TRAJECTORIES_TWO_VERSIONS: 0.0, "async/token_staleness_0": 30.0},
        ),
        row(
            2,
            0.75,
            6.0,
            **{
                mk.TIME_ACTOR_IDLE_RATIO: 0.1,
                mk.TRAJECTORIES_TWO_VERSIONS: 0.5,
                mk.ACTOR_BEHAVIOUR_WEIGHT_MEAN: 0.98,
                "async/token_staleness_0": 10.0,
                "async/token_staleness_1": 60.0,
            },
        ),
    ]
    fig = bench.run_figures(rows, wall_s=60.0, per_step=16)
    assert fig["steps"] == 2 and fig["train_s"] == 10.0
    assert fig["trajectories_per_s"] == pytest.approx(3.2)  # 2 x 16 / 10 s
    assert fig["reward_mean"] == pytest.approx(0.5)
    assert fig["reward_per_s"] == pytest.approx(1.6)  # (0.25 + 0.75) x 16 / 10 s
    assert fig["actor_idle"] == pytest.approx(0.3)
    assert fig["two_versions"] == pytest.approx(0.25)
    assert fig["behaviour_weight_mean"] == pytest.approx(0.98)  # only the step that logs it
    assert math.isnan(fig["time_sync_s"])  # never logged
    assert fig["staleness"] == {0: pytest.approx(0.4), 1: pytest.approx(0.6)}
    assert fig["elapsed_s"] == [4.0, 10.0]


def test_tables_give_the_ratio_to_k0_and_the_median_with_its_spread(bench):
    base, k1 = bench.Setting(TAIL, 0), bench.Setting(TAIL, 1, "group", True)
    rows = {1: [row(1, 0.5, 8.0)], 2: [row(1, 0.5, 4.0)], 3: [row(1, 0.5, 5.0)]}
    results = {}
    for seed, k0_s in ((1, 8.0), (2, 8.0), (3, 10.0)):
        results[(base, seed)] = bench.run_figures([row(1, 0.5, k0_s)], 0.0, per_step=8)
        results[(k1, seed)] = bench.run_figures(rows[seed], 0.0, per_step=8)
    results = bench.with_steady(results, 0)  # one step each: nothing after a warm-up
    assert bench.ratio(results, k1, 1, "trajectories_per_s") == pytest.approx(1.0)
    assert bench.ratio(results, k1, 2, "trajectories_per_s") == pytest.approx(2.0)
    assert bench.median_spread([1.0, 2.0, 3.0]) == "2 (1-3)"
    assert bench.median_spread([1.5]) == "1.5"
    assert bench.median_spread([float("nan")]) == "-"
    medians = bench.median_table(results)
    # k=1 ratios 1.0, 2.0, 2.0 -> median 2; trajectories/s 1, 2, 1.6 -> median 1.6
    assert f"| {TAIL} | k=1 group partial=on | 3 | 1.6 (1-2) | 2 (1-2) | 1.6 (1-2) | 2 (1-2) |" in medians
    assert (
        "| k=1 group partial=on | 2 | 1 | 4.0 | 2.00 | 2.00x | 2.00 | 2.00x | 0.500 | 1.000 |"
        in bench.throughput_table(results)
    )


def test_after_warm_up_leaves_out_the_pipelines_fill(bench):
    # k=1: step 1 waits 8 s for a whole batch, steps 2-4 take 4 s each; 16 trajectories a step
    fig = bench.run_figures([row(1, 0.5, 8.0), row(2, 0.5, 4.0), row(3, 0.5, 4.0), row(4, 0.5, 4.0)], 0.0, 16)
    assert fig["trajectories_per_s"] == pytest.approx(64 / 20)
    assert bench.steady_per_s(fig, 1) == pytest.approx(48 / 12)
    assert bench.steady_per_s(fig, 2) == pytest.approx(32 / 8)
    assert bench.steady_per_s(fig, 0) == fig["trajectories_per_s"]
    assert math.isnan(bench.steady_per_s(fig, 4))


def test_saved_runs_merge_into_one_table(bench, tmp_path, capsys):
    base, k1 = bench.Setting(TAIL, 0), bench.Setting(TAIL, 1, "batch", True)
    for seed in (1, 2):
        results = {
            (s, seed): bench.run_figures([row(1, 0.5, 4.0 if s.k else 8.0)], 0.0, per_step=8) for s in (base, k1)
        }
        bench.save_results(results, tmp_path / f"seed{seed}.json")
    merged = bench.load_results([str(tmp_path / "seed1.json"), str(tmp_path / "seed2.json")])
    assert sorted(merged) == [(base, 1), (base, 2), (k1, 1), (k1, 2)]
    assert (
        bench.main(["--tables", str(tmp_path / "seed1.json"), str(tmp_path / "seed2.json"), "--warmup-steps", "0"]) == 0
    )
    assert f"| {TAIL} | k=1 batch partial=on | 2 | 2 (2-2) | 2 (2-2) | 2 (2-2) | 2 (2-2) |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--partial", "on", "--backend", "sglang"], "--partial on with --backend sglang"),
        (["--latency", "lognormal:median_ms=300"], "--latency: RLINF_EXT_BENCH_SEARCH_LATENCY="),
        (["--partial", "sometimes"], "neither off nor on"),
    ],
)
def test_refuses_before_launching(bench, argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--assets", str(tmp_path), "--out", str(tmp_path / "out"), *argv])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
