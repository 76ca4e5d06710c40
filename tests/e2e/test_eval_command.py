"""`rlinf-ext eval` (the eval launcher) on the tiny assets: its own BM25 index and retrieval server, the results
table written, the server stopped afterwards."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_eval_launcher_runs_the_tiny_evaluation(tiny_assets, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    res = subprocess.run(
        [sys.executable, "-m", "rlinf_ext.cli", "eval", "tiny-cpu-eval", "--no-progress",
         f"paths.tiny_assets={tiny_assets.root}", "rollout.model.model_path=${paths.tiny_assets}/models/qwen2-tiny",
         f"runner.output_dir={tmp_path}", "data.data_size=1", "algorithm.sampling_params.max_new_tokens=16"],
        capture_output=True, text=True, env=env, timeout=280, cwd=str(REPO),
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    run_dir = tmp_path / "searchr1-eval-tiny-cpu"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["overall"]["n"] == 7 and results["overall"]["errors"] == 0
    assert (run_dir / "results.md").is_file() and (run_dir / "generations.jsonl").is_file()
    pid = int(re.search(r"retrieval server on http://\S+ \(pid (\d+)", out).group(1))
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
