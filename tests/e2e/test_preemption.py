"""Preemption: SIGTERM (what Slurm and Kubernetes send before they kill a job) mid-run makes the launcher finish
the current step, write a checkpoint and exit with its own code (75); the same command with
``runner.resume_dir=auto`` continues from that checkpoint to the end."""

from __future__ import annotations

import signal

import pytest
from launch_helpers import launch, metrics_rows, when_step_logged

from rlinf_ext.runner.checkpoints import check_complete, latest_complete_checkpoint
from rlinf_ext.runner.commands import EXIT_PREEMPTED

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_sigterm_finishes_the_step_checkpoints_exits_75_and_resume_continues(tiny_assets_sft, tmp_path):
    run_dir = tmp_path / "searchr1-grpo-tiny-cpu"
    args = [f"paths.tiny_assets={tiny_assets_sft.root}", f"runner.output_dir={tmp_path}",
            f"rollout.model.model_path={tiny_assets_sft.qwen2_tiny_sft_search}", "--no-eval",
            "data.rollout_batch_size=1", "algorithm.group_size=2", "algorithm.n_minibatches=1",
            "algorithm.training_batch_size_per_gpu=2",
            "algorithm.sampling_params.max_new_tokens=24", "agentloop.response_length_total=160",
            "runner.val_before_train=false", "runner.max_steps=4",
            "runner.save_interval=-1"]  # a checkpoint before step 4 can only come from the SIGTERM
    launcher = {}

    def keep_proc(_line, proc):
        launcher["proc"] = proc

    done = when_step_logged(run_dir, 1, lambda: launcher["proc"].send_signal(signal.SIGTERM))
    code, log = launch(args, on_line=keep_proc, timeout=420)
    done.set()
    assert code == EXIT_PREEMPTED, log[-4000:]
    assert "SIGTERM received: finishing the current step" in log
    steps = [r["step"] for r in metrics_rows(run_dir)]
    last = steps[-1]
    assert steps == list(range(1, last + 1)) and last < 4, steps
    checkpoint = run_dir / "checkpoints" / f"global_step_{last}"  # the step in flight finished and was saved
    assert latest_complete_checkpoint(run_dir / "checkpoints") == checkpoint and check_complete(checkpoint) is None
    assert f"stopped by SIGTERM after step {last}; checkpoint {checkpoint}" in log
    assert not (run_dir / "hf_model").exists()  # no conversion in the grace period

    code, log = launch([*args, "runner.resume_dir=auto"], timeout=420)
    assert code == 0, log[-4000:]
    assert f"resumed from {checkpoint}" in log
    assert [r["step"] for r in metrics_rows(run_dir)] == [1, 2, 3, 4]
    assert latest_complete_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "global_step_4"
