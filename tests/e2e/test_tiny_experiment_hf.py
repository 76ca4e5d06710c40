"""End to end on the portable fallback engine: the tiny Search-R1 experiment through the real launcher with
``rollout.rollout_backend=hf`` (transformers ``generate`` in the rollout worker) for training and evaluation.
tiny-cpu.yaml runs vLLM (tests/e2e/test_tiny_experiment.py covers that path); this is the one test that keeps the
fallback's launch path honest: validation before training, two GRPO steps with a weight sync after each,
Megatron -> HF conversion and the evaluation of the converted model, on the contract's random tiny model."""

from __future__ import annotations

import json
import math

import pytest
from launch_helpers import CI_SIZE, launch, metrics_rows

pytestmark = pytest.mark.slow

HF = "rollout.rollout_backend=hf"
VLLM_SYNC_LINE = "Successfully reset prefix cache"  # vLLM logs it at each weight sync


@pytest.mark.timeout(900)
def test_tiny_experiment_on_the_hf_fallback_trains_syncs_and_evaluates(tiny_assets, tmp_path):
    out = tmp_path / "runs"
    code, log = launch(["--eval-override", "data.data_size=1", "--eval-override", HF,
                        f"paths.tiny_assets={tiny_assets.root}", f"runner.output_dir={out}",
                        f"rollout.model.model_path={tiny_assets.qwen2_tiny}", HF, *CI_SIZE, "runner.max_steps=2"])
    assert code == 0, log[-4000:]
    run_dir = out / "searchr1-grpo-tiny-cpu"
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert math.isfinite(rows[0]["time/rollout_start"])  # the engine's start-up, logged once
    # step 1 starts on the weights the validation synced; step 2 needs the step-1 update
    assert "time/sync" not in rows[1] and rows[2]["time/sync"] > 0
    assert all(math.isfinite(r["reward/mean"]) for r in rows[1:])
    assert VLLM_SYNC_LINE not in log  # no vLLM engine anywhere in this run
    results = json.loads((run_dir / "eval" / "global_step_2" / "results.json").read_text())
    assert results["overall"]["n"] == 7 and results["overall"]["errors"] == 0
