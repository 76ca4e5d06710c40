"""End to end: MMSearch-R1 GRPO on the tiny multimodal world through the real launcher, as a user runs it.

Launch 1 trains 2 steps (checkpoint every step) on RLinf's scheduler on CPU with the real BM25 server, the image
cache, tiny-mm-cpu.yaml's engine (vLLM, in the rollout worker's process: the actor's weights reloaded in place and
checked by the multimodal probe) and the HF actor, validating (greedy, 4 test questions, their own image cache)
before training and after step 2, then evaluates the trained model on vLLM in the launcher's process (2 test
questions; the whole evaluation and its resume: tests/e2e/test_mm_eval.py). Launch 2 resumes the finished run
(``resume_dir=auto``) for one more step on another placement: ``actor: 0-1``, two actor processes of RLinf's
group sharding the HF model with FSDP2 over gloo (the one-process checkpoint loads on two ranks, every rank joins
the sync's gathers, rank 0 sends and writes the checkpoint), on the transformers engine
(``rollout.rollout_backend=hf``: the one MM launch that keeps the fallback's path honest, its sync checked by the
multimodal probe on HF logits). The last checkpoint's ``actor/`` is an HF model directory that transformers loads
and generates with from an image.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from launch_helpers import launch, metrics_rows

pytestmark = pytest.mark.slow

CI_SIZE = [
    "data.rollout_batch_size=2",
    "algorithm.group_size=2",
    "algorithm.n_minibatches=1",
    "algorithm.training_batch_size_per_gpu=2",
    "algorithm.sampling_params.max_new_tokens=32",
    "runner.save_interval=1",
]
VAL_QUESTIONS = 4
EVAL_QUESTIONS = 2
VLLM_SYNC_LINE = "Successfully reset prefix cache"  # vLLM logs it at each in-place weight reload


@pytest.mark.timeout(600)
def test_tiny_mm_experiment_trains_checkpoints_resumes_and_exports_an_hf_model(tiny_mm_assets_sft, tmp_path):
    out, rollouts = tmp_path / "runs", tmp_path / "rollouts"
    common = [
        f"paths.tiny_assets={tiny_mm_assets_sft.root}",
        f"runner.output_dir={out}",
        f"runner.rollout_data_dir={rollouts}",
        *CI_SIZE,
    ]
    run_dir = out / "mmsearch-r1-grpo-tiny-cpu"
    code, log1 = launch(
        [
            *common,
            "runner.max_steps=2",
            "runner.val_check_interval=2",
            f"runner.val_samples_per_benchmark={VAL_QUESTIONS}",
            "--eval-override",
            f"data.data_size={EVAL_QUESTIONS}",
        ],
        config="tiny-mm-cpu",
    )
    assert code == 0, log1[-4000:]
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the validation before training (tiny-mm-cpu.yaml)
    assert "reward/mean" not in rows[0]
    # vLLM: step 1 runs on the weights validation 0 synced; step 2 on step 1's update, reloaded in place and
    # checked by the multimodal probe; the engine expanded every image as the actor's processor did
    assert "time/sync" not in rows[1] and rows[2]["time/sync"] > 0 and VLLM_SYNC_LINE in log1
    assert 0 <= rows[2]["rollout/sync_logprob_gap"] < 1e-4, rows[2]
    assert [r["rollout/retokenize_mismatch"] for r in rows[1:]] == [0.0, 0.0]
    results = json.loads((run_dir / "eval" / "global_step_2" / "results.json").read_text())
    overall = next(r for r in results["rows"] if r["data_source"] == r["category"] == "all")
    assert overall["n"] == EVAL_QUESTIONS, results["rows"]
    assert "validation accuracy per category (greedy, 4 test questions)" in log1  # the run summary's trend
    val_sets = []
    for row in (rows[0], rows[2]):  # the per-category table of the MM evaluation, with the step's weights
        assert row["val/n"] == VAL_QUESTIONS and row["val/errors"] == 0, row
        categories = [k.split("/")[1] for k in row if k.startswith("val/") and k.endswith("/accuracy")]
        assert "all" in categories and len(categories) >= 2, row
        for c in categories:
            for m in ("accuracy", "reward", "search_ratio_image", "search_ratio_text"):
                assert math.isfinite(row[f"val/{c}/{m}"]), (c, m, row)
        records = [
            json.loads(line)
            for line in (run_dir / "validation" / f"global_step_{row['step']}" / "generations.jsonl")
            .read_text()
            .splitlines()
        ]
        assert len(records) == VAL_QUESTIONS and all(r["error"] is None for r in records)
        assert not any(t["tool"] == "image" and t["search_ok"] is False for r in records for t in r["turns"]), (
            "an image search of a test question missed: the validation cache was not used"
        )
        val_sets.append({r["item_id"] for r in records})
    assert val_sets[0] == val_sets[1]  # the same fixed questions at every pass
    assert "validation at step 2" in log1 and "| data source | category |" in log1
    rows = rows[1:]
    dumped = {
        r["step"]: [json.loads(line) for line in (rollouts / f"step_{r['step']}.jsonl").read_text().splitlines()]
        for r in rows
    }
    for row in rows:
        categories = {d["category"] for d in dumped[row["step"]]}  # metrics are split by the step's categories
        keys = [
            "reward/mean",
            "actor/loss",
            "agent/image_searches",
            "rollout/all/accuracy",
            *(f"rollout/{c}/{m}" for c in categories for m in ("accuracy", "reward", "search_ratio_image")),
        ]
        for key in keys:
            assert key in row and math.isfinite(row[key]), (key, row)
    assert sum(r["agent/image_searches"] for r in rows) > 0, "the over-searching warm start never searched images"
    assert all(len(d["image_sha1s"]) >= 1 and d["category"] for step in dumped.values() for d in step)

    code, log2 = launch(
        [
            *common,
            "--no-eval",
            "runner.max_steps=3",
            "runner.resume_dir=auto",
            "cluster.component_placement={actor: 0-1, rollout: 0, reward: 0}",
            "rollout.rollout_backend=hf",
        ],
        config="tiny-mm-cpu",
    )
    assert code == 0, log2[-4000:]
    assert "resumed from" in log2 and "global_step_2" in log2
    assert "actor rank 1/2 ready on cpu" in log2 and "data-parallel size 2" in log2
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[-1]["time/sync"] > 0  # the resumed weights synced
    assert VLLM_SYNC_LINE not in log2 and "rollout/retokenize_mismatch" not in rows[-1]  # no vLLM engine this time
    state = torch.load(run_dir / "checkpoints" / "global_step_3" / "actor" / "training_state.pt", weights_only=False)
    assert state["iteration"] == 3 and state["opt_param_scheduler"]["num_steps"] == 3

    from transformers import Qwen2_5_VLForConditionalGeneration
    from vl_helpers_e2e import generate_from_image

    model_dir = run_dir / "checkpoints" / "global_step_3" / "actor"  # written by rank 0 of the two
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir)
    assert sum(p.numel() for p in model.parameters()) > 0
    assert generate_from_image(model, model_dir, tiny_mm_assets_sft.mm)
