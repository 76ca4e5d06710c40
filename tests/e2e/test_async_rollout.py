"""End to end with batches dispatched one step ahead (``runner.max_staleness=1``): the tiny Search-R1 experiment
through the real launcher on the HF engine, preempted and resumed (two launches for both checks: a launch costs
~45 s of start-up).

Launch 1 gets SIGTERM once step 1 is logged: it finishes the step in flight (step 2, or step 3 when the signal comes
late: step 2 trains a batch that is ready), checkpoints it, waits for the batch already dispatched for the next step
and discards it, and exits 75. Launch 2 resumes and trains to the end. The
trained prompts of every step (the rollout dumps' uids) are those of the training loader's batch for that step,
the order an uninterrupted run trains (tests/runner/test_trainer_pipeline.py checks a resumed run against an
uninterrupted one on fakes), and the batch read ahead before the stop is trained after the resume.
"""

from __future__ import annotations

import json
import math
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
from launch_helpers import CI_SIZE, launch, metrics_rows, when_step_logged

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner.commands import EXIT_PREEMPTED

pytestmark = pytest.mark.slow

MAX_STEPS = 4  # a SIGTERM that reaches the second step late still stops before the last
ARGS = [a for a in CI_SIZE if not a.startswith(("runner.save_interval=", "runner.val_samples"))] + [
    "runner.save_interval=-1", "runner.val_before_train=false", "runner.val_check_interval=-1",
    "rollout.rollout_backend=hf", "rollout.return_logprobs=true", "runner.max_staleness=1",
    f"runner.max_steps={MAX_STEPS}", "--no-eval"]


@dataclass
class Run:
    out: Path
    run_dir: Path
    args: list[str]
    code: int
    log: str
    resume_code: int
    resume_log: str


@pytest.fixture(scope="module")
def preempted_async_run(tiny_assets, tmp_path_factory) -> Run:
    out = tmp_path_factory.mktemp("async_k1")
    run_dir = out / "searchr1-grpo-tiny-cpu"
    args = [f"paths.tiny_assets={tiny_assets.root}", f"runner.output_dir={out}",
            f"rollout.model.model_path={tiny_assets.qwen2_tiny}", f"runner.rollout_data_dir={out / 'dumps'}", *ARGS]
    launcher = {}
    done = when_step_logged(run_dir, 1, lambda: launcher["proc"].send_signal(signal.SIGTERM))
    code, log = launch(args, on_line=lambda _line, proc: launcher.setdefault("proc", proc), timeout=420)
    done.set()
    resume_code, resume_log = launch([*args, "runner.resume_dir=auto"], timeout=420)
    (out / "launch_1.log").write_text(log)
    (out / "launch_2.log").write_text(resume_log)
    return Run(out, run_dir, args, code, log, resume_code, resume_log)


def loader_batches(run: Run) -> list[list[str]]:
    """The prompt uids of the training loader's batches, in the order an uninterrupted run trains them."""
    from rlinf_ext.runner.prepare import build_datasets, load_checked_config
    from rlinf_ext.runner.trainer import training_loader

    overrides = [a for a in run.args if not a.startswith("--")]
    cfg = load_checked_config("tiny-cpu", overrides, check_paths=False)
    train_ds, _ = build_datasets(cfg)
    batches = iter(training_loader(cfg, train_ds))
    return [[item["uid"] for item in next(batches)] for _ in range(MAX_STEPS)]


def trained_uids(run: Run, step: int) -> list[str]:
    """The prompts step ``step`` trained: its dump's group uids ``s<batch>-<k>-<prompt uid>``, in batch order."""
    rows = [json.loads(line) for line in (run.out / "dumps" / f"step_{step}.jsonl").read_text().splitlines()]
    return sorted({r["uid"] for r in rows})


@pytest.mark.timeout(900)
def test_k1_sigterm_drains_then_resume_trains_the_uninterrupted_order(preempted_async_run):
    run = preempted_async_run
    assert run.code == EXIT_PREEMPTED, run.log[-4000:]
    assert "1 batch(es) in flight after step" in run.log  # read ahead, waited for, discarded
    assert run.resume_code == 0, run.resume_log[-4000:]
    rows = metrics_rows(run.run_dir)
    assert [r["step"] for r in rows] == list(range(1, MAX_STEPS + 1))
    expected = loader_batches(run)
    for step in range(1, MAX_STEPS + 1):
        batch = step - 1
        assert trained_uids(run, step) == [f"s{batch}-{k:04d}-{uid}" for k, uid in enumerate(expected[batch])], step


@pytest.mark.timeout(900)
def test_k1_run_logs_staleness_and_idle_time(preempted_async_run):
    run = preempted_async_run
    stopped = re.search(r"stopped by SIGTERM after step (\d+)", run.log)
    assert stopped, run.log[-4000:]
    stop = int(stopped.group(1))
    rows = {r["step"]: r for r in metrics_rows(run.run_dir)}
    for step, row in rows.items():
        batch, start = step - 1, (0 if step <= stop else stop)  # a resume refills the pipeline at its version
        assert row[mk.STALENESS_HEAD_MAX] == row[mk.STALENESS_HEAD_MEAN] == min(batch - start, 1), step
        assert math.isfinite(row[mk.TIME_WAIT_ROLLOUT]) and row[mk.TIME_WAIT_ROLLOUT] >= 0
        assert 0 <= row[mk.TIME_ACTOR_IDLE_RATIO] <= 1 and 0 <= row[mk.TIME_ROLLOUT_IDLE_RATIO] <= 1
        assert math.isfinite(row[mk.REWARD_MEAN])
        # the decoupled loss weighs each token by pi_prox / pi_behav: the engine's log-probs reached the actor
        assert math.isfinite(row[mk.ACTOR_BEHAVIOUR_WEIGHT_MEAN]) and math.isfinite(row[mk.ACTOR_BEHAVIOUR_KL])
        # every sampled token carries the version that sampled it: the fractions at staleness 0 and 1 add up to 1
        assert math.isclose(row[mk.token_staleness(0)] + row.get(mk.token_staleness(1), 0.0), 1.0), row
        assert 0.0 <= row[mk.TRAJECTORIES_TWO_VERSIONS] <= 1.0
