"""End to end: the tiny experiment through the real launcher, in child processes as a user runs it, and extending
the finished run (the most common use of resume). On tiny-cpu.yaml's engine, vLLM: in process and eager inside the
rollout worker for training (weights synced into the running engine), in the launcher's process for the evaluation;
tests/e2e/test_tiny_experiment_hf.py runs the transformers fallback.

Launch 1 trains 2 steps (checkpoint every step) with a real retrieval server, RLinf's cluster on CPU, HF->Megatron
at start, Megatron->HF at the end and the evaluation of that model into ``eval/global_step_2/``. Launch 2 extends
the finished run: ``runner.max_steps=4 runner.resume_dir=auto`` resumes at step 2 and trains 2 more steps; after
its first step the test kills the retrieval server: searches then fail (counted) and training still finishes. It
evaluates the new model into ``eval/global_step_4/`` beside the first (one directory per checkpoint: it used to
refuse, "eval holds generations of a different setup"), and its summary says where it resumed from and covers
the whole run's reward history. A shortened config (small batches) keeps this CI-sized; the full experiment is
benchmarks/tiny_experiment_bench.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal

import pytest
from launch_helpers import CI_SIZE, launch, metrics_rows, when_step_logged

pytestmark = pytest.mark.slow


SERVER_RE = re.compile(r"retrieval server on http://([\d.]+):(\d+) \(pid (\d+)")


@pytest.mark.timeout(900)
def test_tiny_experiment_trains_extends_survives_a_dead_server_and_evaluates_each_model(tiny_assets_sft, tmp_path):
    out = tmp_path / "runs"
    rollouts = tmp_path / "rollouts"
    # the search-only warm start: the shipped one gives up without searching on ~65% of the trajectories, and
    # the dead-server check needs step 4's four trajectories to search
    common = [f"paths.tiny_assets={tiny_assets_sft.root}", f"runner.output_dir={out}",
              f"rollout.model.model_path={tiny_assets_sft.qwen2_tiny_sft_search}",
              f"runner.rollout_data_dir={rollouts}", *CI_SIZE]
    run_dir = out / "searchr1-grpo-tiny-cpu"

    # ---- launch 1: two steps from scratch, the converted model evaluated (one question per benchmark file)
    code, log1 = launch(["--eval-override", "data.data_size=1", *common, "runner.max_steps=2"])
    assert code == 0, log1[-4000:]
    results_2 = json.loads((run_dir / "eval" / "global_step_2" / "results.json").read_text())
    assert results_2["overall"]["n"] == 7, results_2
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the validation before training (tiny-cpu.yaml)
    val = rows[0]
    assert val["val/n"] == 7 and val["val/errors"] == 0 and math.isfinite(val["val/all/em"]), val
    assert "reward/mean" not in val
    assert len((run_dir / "validation" / "global_step_0" / "generations.jsonl").read_text().splitlines()) == 7
    rows = rows[1:]
    for row in rows:
        for key in ("reward/mean", "actor/loss", "agent/searches", "time/step"):
            assert key in row and math.isfinite(row[key]), (key, row)
    assert sum(r["agent/searches"] for r in rows) > 0, "the agent never searched against the real server"
    assert (run_dir / "checkpoints" / "global_step_2" / "actor").is_dir()
    assert (run_dir / "reward_curve.png").is_file()
    steps_dumped = sorted(p.name for p in rollouts.glob("step_*.jsonl"))
    assert steps_dumped == ["step_1.jsonl", "step_2.jsonl"]
    traj = json.loads((rollouts / "step_1.jsonl").read_text().splitlines()[0])
    assert traj["response_text"] and "reward" in traj
    assert "finished: 2 step(s)" in log1 and "converted HF     : " in log1
    # vLLM: each weight sync resets the engine's prefix cache (step 2's, after step 1's update, at least)
    assert "Successfully reset prefix cache" in log1
    assert math.isfinite(val["time/rollout_start"]) and rows[1]["time/sync"] > 0

    # ---- launch 2: resume, and kill the retrieval server once step 3 is logged
    server: dict = {}

    def note_server_pid(line: str, _proc) -> None:
        if m := SERVER_RE.search(line):
            server["pid"] = int(m.group(3))

    def kill_server():
        os.kill(server["pid"], signal.SIGKILL)  # the pid line comes long before step 3
        server["killed"] = True

    done = when_step_logged(run_dir, 3, kill_server)
    # the evaluation (one question per benchmark file) then runs against the dead server too
    code, log2 = launch(["--eval-override", "data.data_size=1", *common, "runner.max_steps=4",
                         "runner.resume_dir=auto"], on_line=note_server_pid)
    done.set()
    assert code == 0, log2[-4000:]
    assert server.get("killed"), "the test never saw step 3 and did not kill the server"
    rows = {r["step"]: r for r in metrics_rows(run_dir)}
    assert sorted(rows) == [0, 1, 2, 3, 4], "launch 2 did not continue at step 3 (or validated again at step 0)"
    assert rows[4]["agent/search_failures"] > 0, "searches against a dead server were not counted as failures"
    assert math.isfinite(rows[4]["actor/loss"])
    assert (run_dir / "checkpoints" / "global_step_4").is_dir()
    # the extended run's model is evaluated beside the first one, which stays as it was
    results = json.loads((run_dir / "eval" / "global_step_4" / "results.json").read_text())
    assert results["overall"]["n"] == 7 and results["overall"]["errors"] == 0  # one question per benchmark
    assert f"eval table       : {run_dir / 'eval' / 'global_step_4' / 'results.md'}" in log2
    assert json.loads((run_dir / "eval" / "global_step_2" / "results.json").read_text()) == results_2
    # the summary of launch 2 covers the whole run: 4 steps, step 1's reward (launch 1) as the first window
    assert f"resumed from {run_dir / 'checkpoints' / 'global_step_2'}" in log2
    assert "finished: 4 step(s)" in log2
    assert f"first 1 vs last 1 step(s): {rows[1]['reward/mean']:.3f} -> {rows[4]['reward/mean']:.3f}" in log2

    # ---- the converted HF model loads and generates
    hf_dir = run_dir / "hf_model" / "global_step_4"
    assert f"converted HF     : {hf_dir}" in log2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    ids = tok("Question: who wrote it?", return_tensors="pt").input_ids
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] > ids.shape[1]
    assert torch.isfinite(model(ids).logits).all()
