"""End to end on the portable fallback engine, preempted: the tiny Search-R1 experiment through the real launcher
with ``rollout.rollout_backend=hf`` (transformers ``generate`` in the rollout worker) for training and evaluation,
stopped by SIGTERM and resumed.

tiny-cpu.yaml runs vLLM (the reference recipe's tiny run, tests/e2e/test_reference_recipe.py, covers that engine on the
same model shape); this module keeps the fallback's launch path honest, and tiny-cpu.yaml's own (tiny assets, the
launched BM25 server): validation before training, GRPO steps with a weight sync before each step that follows an
update, Megatron -> HF conversion and the evaluation of the converted model, on the contract's random tiny model.

The same run is the preemption check (one run for both: a launch costs ~45 s of start-up): SIGTERM (what Slurm and
Kubernetes send before they kill a job) once step 1 is logged makes the launcher finish the current step, write a
checkpoint and exit with its own code (75); the same command with ``runner.resume_dir=auto`` continues from that
checkpoint to the end, converts and evaluates.
"""

from __future__ import annotations

import json
import math
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
from launch_helpers import CI_SIZE, launch, metrics_rows, when_step_logged

from rlinf_ext.runner.checkpoints import check_complete, latest_complete_checkpoint
from rlinf_ext.runner.commands import EXIT_PREEMPTED

pytestmark = pytest.mark.slow

HF = "rollout.rollout_backend=hf"
VLLM_SYNC_LINE = "Successfully reset prefix cache"  # vLLM logs it at each weight sync
MAX_STEPS = 3
# CI_SIZE without its checkpoint every step: a checkpoint before the last step can only come from the SIGTERM
ARGS = [a for a in CI_SIZE if not a.startswith("runner.save_interval=")] + ["runner.save_interval=-1"]


@dataclass
class PreemptedRun:
    run_dir: Path
    code: int
    log: str
    checkpoint: Path | None
    steps_before_resume: list[int]  # metrics.jsonl's steps after launch 1
    converted_before_resume: bool
    resume_code: int
    resume_log: str


@pytest.fixture(scope="module")
def preempted_run(tiny_assets, tmp_path_factory) -> PreemptedRun:
    out = tmp_path_factory.mktemp("hf_preempted")
    run_dir = out / "searchr1-grpo-tiny-cpu"
    args = ["--eval-override", "data.data_size=1", "--eval-override", HF, f"paths.tiny_assets={tiny_assets.root}",
            f"runner.output_dir={out}", f"rollout.model.model_path={tiny_assets.qwen2_tiny}", HF, *ARGS,
            f"runner.max_steps={MAX_STEPS}"]
    launcher = {}

    def keep_proc(_line, proc):
        launcher["proc"] = proc

    done = when_step_logged(run_dir, 1, lambda: launcher["proc"].send_signal(signal.SIGTERM))
    code, log = launch(args, on_line=keep_proc, timeout=420)
    done.set()
    checkpoint = latest_complete_checkpoint(run_dir / "checkpoints")
    steps = [r["step"] for r in metrics_rows(run_dir)]
    converted = (run_dir / "hf_model").exists()
    resume_code, resume_log = launch([*args, "runner.resume_dir=auto"], timeout=600)
    (out / "launch_1.log").write_text(log)  # kept for a failure's reading (pytest's basetemp)
    (out / "launch_2.log").write_text(resume_log)
    return PreemptedRun(run_dir, code, log, checkpoint, steps, converted, resume_code, resume_log)


@pytest.mark.timeout(1200)
def test_sigterm_finishes_the_step_checkpoints_exits_75_and_resume_continues(preempted_run):
    run = preempted_run
    assert run.code == EXIT_PREEMPTED, run.log[-4000:]
    assert "SIGTERM received: finishing the current step" in run.log
    steps = run.steps_before_resume
    last = steps[-1]
    assert steps == list(range(0, last + 1)) and 1 <= last < MAX_STEPS, steps  # step 0: validation before training
    checkpoint = run.run_dir / "checkpoints" / f"global_step_{last}"  # the step in flight finished and was saved
    assert run.checkpoint == checkpoint and check_complete(checkpoint) is None
    assert f"stopped by SIGTERM after step {last}; checkpoint {checkpoint}" in run.log
    assert not run.converted_before_resume  # no conversion in the grace period

    assert run.resume_code == 0, run.resume_log[-4000:]
    assert f"resumed from {checkpoint}" in run.resume_log
    assert [r["step"] for r in metrics_rows(run.run_dir)] == list(range(0, MAX_STEPS + 1))
    assert latest_complete_checkpoint(run.run_dir / "checkpoints") == \
        run.run_dir / "checkpoints" / f"global_step_{MAX_STEPS}"


@pytest.mark.timeout(1200)
def test_tiny_experiment_on_the_hf_fallback_trains_syncs_and_evaluates(preempted_run):
    run = preempted_run
    assert run.resume_code == 0, run.resume_log[-4000:]
    rows = metrics_rows(run.run_dir)
    assert [r["step"] for r in rows] == list(range(MAX_STEPS + 1))  # step 0 once: a resume does not validate again
    assert math.isfinite(rows[0]["time/rollout_start"])  # the engine's start-up, logged once
    # step 1 starts on the weights the validation synced; step 2 needs the step-1 update (synced in launch 1, or
    # after the resume's start), and so does every later step
    assert "time/sync" not in rows[1] and all(r["time/sync"] > 0 for r in rows[2:]), rows
    assert all(math.isfinite(r["reward/mean"]) for r in rows[1:])
    assert VLLM_SYNC_LINE not in run.log + run.resume_log  # no vLLM engine anywhere in this run
    results = json.loads((run.run_dir / "eval" / f"global_step_{MAX_STEPS}" / "results.json").read_text())
    assert results["overall"]["n"] == 7 and results["overall"]["errors"] == 0
