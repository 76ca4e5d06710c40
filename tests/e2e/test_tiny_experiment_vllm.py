"""End to end on vLLM: the tiny Search-R1 experiment through the real launcher with ``rollout.rollout_backend=vllm``
(in-process, eager vLLM inside the rollout worker), on a head-size-32 tiny Qwen2 (vLLM's CPU attention refuses 16):
validation before training, two GRPO steps with a weight sync into the running engine after each, Megatron -> HF
conversion, and the evaluation of the converted model, also on vLLM (in the launcher's process)."""

from __future__ import annotations

import json

import pytest
from launch_helpers import CI_SIZE, launch, metrics_rows

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_tiny_experiment_on_vllm_trains_syncs_and_evaluates(tiny_assets, tmp_path):
    from transformers import AutoTokenizer

    from rlinf_ext.assets.core.models import TinyQwen2Shape, make_qwen2, save_hf_model

    tok = AutoTokenizer.from_pretrained(str(tiny_assets.tokenizer_dir))  # the tiny prompts fit its vocabulary
    model_dir = tmp_path / "qwen2-tiny-head32"
    save_hf_model(make_qwen2(tok, TinyQwen2Shape(num_attention_heads=2, num_key_value_heads=1), seed=0), tok, model_dir)
    out = tmp_path / "runs"
    code, log = launch(["--eval-override", "data.data_size=1", "--eval-override", "rollout.rollout_backend=vllm",
                        f"paths.tiny_assets={tiny_assets.root}", f"runner.output_dir={out}",
                        f"rollout.model.model_path={model_dir}", "rollout.rollout_backend=vllm",
                        *CI_SIZE, "runner.max_steps=2"])
    assert code == 0, log[-4000:]
    run_dir = out / "searchr1-grpo-tiny-cpu"
    rows = [r for r in metrics_rows(run_dir) if "reward/mean" in r]
    assert len(rows) == 2, rows
    assert "Successfully reset prefix cache" in log  # each weight sync resets the engine's prefix cache
    results = json.loads((run_dir / "eval" / "global_step_2" / "results.json").read_text())
    assert results["meta"]["questions"] > 0
