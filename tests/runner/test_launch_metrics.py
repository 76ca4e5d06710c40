"""The on_step sink: TensorBoard events, jsonl metrics, trajectory dumps, reward plot, pure summaries."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlinf_ext.protocol.metric_keys import RETOKENIZE_COUNTS
from rlinf_ext.runner.metrics import (
    MetricsSink,
    engine_mismatch_step,
    first_last_means,
    moving_average,
    plot_reward_curve,
    read_metrics,
    scalar_metrics,
    to_jsonable,
)


def test_first_last_means_hand_computed():
    assert first_last_means([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], window=2) == pytest.approx((0.1, 0.9))
    # the window is clipped so that the two windows never overlap: 5 values, window 4 -> 2
    assert first_last_means([1, 2, 3, 4, 5], window=4) == pytest.approx((1.5, 4.5))
    # non-finite values are ignored
    assert first_last_means([float("nan"), 1.0, 3.0], window=1) == pytest.approx((1.0, 3.0))
    assert first_last_means([2.0], window=3) == (2.0, 2.0)
    with pytest.raises(ValueError, match="no finite"):
        first_last_means([float("nan")], window=1)


def test_engine_mismatch_step_hand_computed():
    # two rollout ranks, cumulative counts: 3 mismatches in 10 prompts, of which 1 in 4 seen before -> 2 of 6 new
    states = [{RETOKENIZE_COUNTS: (1, 6)}, {RETOKENIZE_COUNTS: (2, 4)}, {"weight_version": 3}]
    assert engine_mismatch_step(states, (1, 4)) == (pytest.approx(1 / 3), (3, 10))
    assert engine_mismatch_step(states, (3, 10)) == (None, (3, 10))  # nothing served since: no rate
    assert engine_mismatch_step([{}], (0, 0)) == (None, (0, 0))  # an engine that does not count
    with pytest.raises(ValueError, match="fewer than"):
        engine_mismatch_step(states, (0, 11))


def test_moving_average_hand_computed():
    assert moving_average([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([2.0, 4.0], window=5) == [2.0, 3.0]
    assert moving_average([], window=3) == []


def test_scalar_metrics_and_jsonable():
    out = scalar_metrics({"a": 1, "b": torch.tensor(2.5), "c": "text", "d": True, "e": [1, 2]})
    assert out == {"a": 1.0, "b": 2.5}
    assert to_jsonable({"t": torch.tensor([1, 2]), "x": float("inf"), "n": (1, None)}) == {
        "t": [1, 2],
        "x": "inf",
        "n": [1, None],
    }


def test_sink_writes_tensorboard_jsonl_trajectories_and_plot(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = MetricsSink(
        log_dir=tmp_path / "logs", rollout_data_dir=tmp_path / "rollouts", total_steps=3, show_progress=False
    )
    rewards = [0.1, 0.3, 0.6]
    for step, r in enumerate(rewards, start=1):
        traj = [{"uid": "q1", "response_ids": torch.tensor([5, 6]), "reward": r}]
        sink(step, {"reward/mean": r, "actor/loss": torch.tensor(0.5), "note": "x"}, traj)
    plot = sink.close()
    assert sink.close() == plot  # idempotent

    rows = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    assert [r["reward/mean"] for r in rows] == rewards
    assert all(math.isfinite(r["actor/loss"]) for r in rows)

    dumped = [json.loads(s) for s in (tmp_path / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert dumped == [{"step": 2, "uid": "q1", "response_ids": [5, 6], "reward": 0.3}]

    assert plot == tmp_path / "logs" / "reward_curve.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    acc = EventAccumulator(str(tmp_path / "logs" / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("reward/mean")] == pytest.approx(rewards)
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2, 3]


def test_resumed_run_replaces_steps_in_metrics_history(tmp_path):
    with MetricsSink(log_dir=tmp_path, show_progress=False) as first:
        first(1, {"reward/mean": 0.1}, None)
        first(2, {"reward/mean": 0.2}, None)
    with MetricsSink(log_dir=tmp_path, show_progress=False) as second:
        second(2, {"reward/mean": 0.25}, None)  # step 2 re-run after a crash before its checkpoint
        second(3, {"reward/mean": 0.3}, None)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(1, 0.1), (2, 0.25), (3, 0.3)]


def test_unknown_backend_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="logger_backends.*'mlflow'"):
        MetricsSink(log_dir=tmp_path, backends=["tensorboard", "mlflow"], show_progress=False)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_wandb_runs_offline_without_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    sink = MetricsSink(
        log_dir=tmp_path, backends=["tensorboard", "wandb"], project="p", experiment="e", show_progress=False
    )
    assert sink._wandb is not None and sink._wandb.settings.mode == "offline"
    sink(1, {"reward/mean": 0.5}, None)
    sink.close()
    assert list((tmp_path / "wandb").glob("offline-run-*")), "offline run directory missing"


def test_plot_with_a_smoothed_trend(tmp_path):
    history = [{"step": s, "reward/mean": (s % 3) / 3} for s in range(1, 21)]
    path = plot_reward_curve(history, tmp_path / "r.png", title="t")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_validation_only_step_zero_is_logged_but_not_dumped(tmp_path):
    """The validation before training reaches the sink as step 0 with no trajectories: a metrics row, no dump file."""
    with MetricsSink(log_dir=tmp_path / "logs", rollout_data_dir=tmp_path / "rollouts", show_progress=False) as sink:
        sink(0, {"val/all/em": 0.25}, [])
        sink(1, {"reward/mean": 0.5}, [{"uid": "q1", "reward": 0.5}])
    rows = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[0]["val/all/em"] == 0.25
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["step_1.jsonl"]
