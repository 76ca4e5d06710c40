"""End to end: the tiny experiment through the real launcher, in child processes as a user runs it.

Launch 1 trains 2 steps (checkpoint every step) with a real retrieval server, RLinf's cluster on CPU, HF->Megatron
at start and Megatron->HF at the end. Launch 2 resumes (`runner.resume_dir=auto`) and trains 2 more steps; after
its first step the test kills the retrieval server: searches then fail (counted) and training still finishes.
A shortened config (small batches) keeps this CI-sized; the full experiment is benchmarks/tiny_experiment_bench.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

CI_SIZE = [
    "data.rollout_batch_size=2",
    "algorithm.group_size=2",
    "algorithm.n_minibatches=1",
    "algorithm.training_batch_size_per_gpu=2",
    "algorithm.sampling_params.max_new_tokens=32",
    "agentloop.response_length_total=192",
    "runner.save_interval=1",
    "runner.val_samples_per_benchmark=1",  # the validation before training: one question per benchmark
]


def launch(args: list[str], on_line=None, timeout: float = 240) -> tuple[int, str]:
    """Run `launchers/train.py tiny-cpu ARGS`; `on_line(line, proc)` sees each output line as it comes."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "launchers" / "train.py"), "tiny-cpu", "--no-progress", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(REPO),
    )
    lines: list[str] = []
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line, proc)
        return proc.wait(), "".join(lines)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()


def metrics_rows(run_dir: Path) -> list[dict]:
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            pass
    return rows


SERVER_RE = re.compile(r"retrieval server on http://([\d.]+):(\d+) \(pid (\d+)")


@pytest.mark.timeout(600)
def test_tiny_experiment_trains_resumes_survives_a_dead_server_and_converts(tiny_assets_sft, tmp_path):
    out = tmp_path / "runs"
    rollouts = tmp_path / "rollouts"
    # the search-only warm start: the shipped one gives up without searching on ~65% of the trajectories, and
    # the dead-server check needs step 4's four trajectories to search
    common = [f"paths.tiny_assets={tiny_assets_sft.root}", f"runner.output_dir={out}",
              f"rollout.model.model_path={tiny_assets_sft.qwen2_tiny_sft_search}",
              f"runner.rollout_data_dir={rollouts}", *CI_SIZE]
    run_dir = out / "searchr1-grpo-tiny-cpu"

    # ---- launch 1: two steps from scratch
    code, log1 = launch(["--no-eval", *common, "runner.max_steps=2"])
    assert code == 0, log1[-4000:]
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

    # ---- launch 2: resume, and kill the retrieval server once step 3 is logged
    server: dict = {}

    def note_server_pid(line: str, _proc) -> None:
        if m := SERVER_RE.search(line):
            server["pid"] = int(m.group(3))

    done = threading.Event()

    def kill_server_after_step_3():  # polls the metrics file: the launcher prints nothing between steps
        while not done.is_set():
            metrics = run_dir / "metrics.jsonl"
            if "pid" in server and metrics.exists() and any(r["step"] == 3 for r in metrics_rows(run_dir)):
                os.kill(server["pid"], signal.SIGKILL)
                server["killed"] = True
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_server_after_step_3, daemon=True)
    killer.start()
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
    results = json.loads((run_dir / "eval" / "results.json").read_text())
    assert results["overall"]["n"] == 7 and results["overall"]["errors"] == 0  # one question per benchmark
    assert f"eval table       : {run_dir / 'eval' / 'results.md'}" in log2

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
