"""Launcher plumbing: signal handling, reward summary (the Ray address: test_ray_address.py). (Ray and every other process being
stopped on Ctrl-C is checked end to end in tests/e2e/test_dynamic_sampling_run.py.)"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from rlinf_ext.runner.errors import RunInterrupted
from rlinf_ext.runner.services import stop_on_signals
from rlinf_ext.runner.summary import RunSummary, metric_trend, reward_trend, reward_window, validation_trend


def test_stop_on_signals_turns_sigterm_into_interrupt_and_restores_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RunInterrupted, match="SIGTERM"):
        with stop_on_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts this sleep
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_while_training_asks_for_a_graceful_stop_and_a_second_one_interrupts():
    with stop_on_signals() as stop:
        with stop.defer():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs between bytecodes; it must not raise
            assert stop.requested and stop.signal_name == "SIGTERM"
            with pytest.raises(RunInterrupted, match="SIGTERM"):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
        assert not stop.deferring
        with pytest.raises(RunInterrupted, match="SIGINT"):  # Ctrl-C never waits for the step
            with stop.defer():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)


def test_reward_window_never_overlaps():
    assert [reward_window(n) for n in (1, 2, 3, 4, 6, 20, 30, 50)] == [1, 1, 1, 1, 2, 6, 10, 10]


def test_reward_trend_and_summary(tmp_path):
    rows = [
        {"step": s, "reward/mean": r, "agent/searches": 0.5 + s / 10}
        for s, r in enumerate([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], start=1)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps, first, last = reward_trend(tmp_path, window=10)  # 9 steps: a third = 3 at each end
    assert steps == 9 and first == pytest.approx(0.1) and last == pytest.approx(0.7)
    assert metric_trend(tmp_path, "agent/searches")[1:] == pytest.approx((0.7, 1.3))
    assert metric_trend(tmp_path, "no/such/key") == (9, None, None)
    text = RunSummary(
        "tiny",
        steps=steps,
        first_reward=first,
        last_reward=last,
        log_dir=tmp_path,
        wall_time_s=12,
        reward_window=3,
        searches=(0.7, 1.3),
    ).format()
    assert "first 3 vs last 3 step(s): 0.100 -> 0.700 (+0.600)" in text
    assert "searches per trajectory, same steps: 0.70 -> 1.30" in text
    assert f"logs (TB, jsonl) : {tmp_path}" in text and "converted HF     : (none)" in text


def test_summary_of_an_extended_run_covers_every_launch(tmp_path):
    """Launch 1 logged steps 1-3 and crashed after its step-2 checkpoint; launch 2 resumed at 2 and ran 3-4:
    the summary reads the whole history, the re-done step 3 as launch 2 logged it."""
    rows = [
        {"step": 1, "reward/mean": 0.1},
        {"step": 2, "reward/mean": 0.2},
        {"step": 3, "reward/mean": 0.9},
        {"step": 3, "reward/mean": 0.3},
        {"step": 4, "reward/mean": 0.4},
        {"step": 5, "reward/mean": 9.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # step 5: a row an earlier launch logged past where this run ended (resumed from before it)
    steps, first, last = reward_trend(tmp_path, window=2, last_step=4)
    assert steps == 4 and first == pytest.approx(0.1) and last == pytest.approx(0.4)
    text = RunSummary(
        "tiny",
        steps=steps,
        first_reward=first,
        last_reward=last,
        reward_window=1,
        resumed_from=tmp_path / "checkpoints" / "global_step_2",
    ).format()
    assert f"resumed from {tmp_path / 'checkpoints' / 'global_step_2'}; trends below cover the whole run" in text
    assert "finished: 4 step(s)" in text


def test_step_zero_validation_is_not_a_training_step(tmp_path):
    """The validation before training logs a step-0 row without reward: it counts in the validation curve only."""
    rows = [{"step": 0, "val/all/em": 0.25, "val/n": 8}]
    rows += [{"step": s, "reward/mean": r} for s, r in enumerate([0.2, 0.4, 0.6, 0.8], start=1)]
    rows[-1].update({"val/all/em": 0.5, "val/n": 8})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps, first, last = reward_trend(tmp_path, window=2)  # 4 steps: 1 at each end
    assert steps == 4 and first == pytest.approx(0.2) and last == pytest.approx(0.8)
    assert validation_trend(tmp_path) == [(0, 0.25, 8), (4, 0.5, 8)]
    text = RunSummary("tiny", steps=steps, validations=validation_trend(tmp_path)).format()
    assert "validation EM (greedy, 8 test questions): step 0: 0.250, step 4: 0.500" in text
