"""scripts/gpu_smoke.py with --device cpu: every stage but S1 (the asset generator has its own tests) runs in its
own process on tiny shapes and passes; a failing stage and a stage past its timeout still leave their JSON line,
with the exception text, and make the driver exit non-zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test runs the smoke script's stages in processes of their own

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_smoke.py"


def run(out: Path, *args: str, timeout: float = 1500) -> tuple[subprocess.CompletedProcess, list[dict]]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=timeout)
    lines = (out / "results.jsonl").read_text().splitlines() if (out / "results.jsonl").is_file() else []
    return proc, [json.loads(line) for line in lines]


@pytest.mark.timeout(1600)
def test_every_cpu_runnable_stage_passes_and_reports(tmp_path):
    proc, records = run(tmp_path, "--stages", "S0", "S2", "S3", "S4", "S6", "S7", "S5", "--budget-s", "1500")
    by_stage = {r["stage"]: r for r in records}
    assert list(by_stage) == ["S0", "S2", "S3", "S4", "S6", "S7", "S5"], proc.stdout[-3000:]  # S5 last
    for stage, record in by_stage.items():
        assert record["status"] == "pass", (stage, record)
        assert record["checks"] and all(record["checks"].values()), (stage, record)
    assert proc.returncode == 0 and "summary: S0 pass, S2 pass, S3 pass, S4 pass, S6 pass, S7 pass, S5 pass" in proc.stdout
    assert by_stage["S0"]["figures"]["megatron.core"] == "0.16.1"
    assert "import rlinf.algorithms (rlinf.scheduler and ray stubbed)" in by_stage["S0"]["checks"]
    assert "consumer logits == producer logits (bitwise)" in by_stage["S4"]["checks"]
    assert any(k.startswith("T=") and "estimated" in v for k, v in by_stage["S5"]["figures"].items())
    assert "[ok] fp16 dynamic: save/load resumes identically (loss, loss scale, weights)" in proc.stdout
    assert by_stage["S7"]["checks"]["policy is FSDP2-sharded over the one-rank group"]
    assert "onload restores weights and AdamW state bit-exactly" in by_stage["S7"]["checks"]


@pytest.mark.timeout(300)
def test_a_failing_stage_and_a_stage_out_of_time_are_recorded(tmp_path):
    work = tmp_path / "work"
    broken = work / "qwen2-tiny-random"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 64}')  # no weights, missing fields
    proc, records = run(tmp_path, "--stages", "S2", "--work", str(work))
    assert proc.returncode == 1 and records[-1]["stage"] == "S2" and records[-1]["status"] == "fail"
    assert "Error" in records[-1]["error"] and "error: " in proc.stdout and "summary: S2 fail" in proc.stdout
    proc, records = run(tmp_path, "--stages", "S0", "--timeout-scale", "0.01")  # 0.6 s: the imports alone take longer
    assert proc.returncode == 1 and records[-1]["stage"] == "S0" and "timed out after" in records[-1]["error"]
