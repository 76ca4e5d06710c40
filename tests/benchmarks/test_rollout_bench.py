"""benchmarks/rollout_bench.py: its pure helpers by hand, and the script end to end on the tiny shape with tiny sizes
(both engines, each in its own process): it exits 0, both engines generate exactly prompts x group x turns x
max_new_tokens tokens, and the table and the JSON carry the figures."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "rollout_bench.py"


def load_bench():
    return load_script(SCRIPT)


def test_unreachable_ids_are_eos_tags_and_ids_past_the_tokenizer():
    bench = load_bench()
    assert bench.unreachable_ids({7, 3}, [5, 3], tokenizer_len=10, vocab_size=13) == [3, 5, 7, 10, 11, 12]
    assert bench.unreachable_ids({0}, [], tokenizer_len=4, vocab_size=4) == [0]


def test_final_norm_scale_gives_the_logit_std():
    bench = load_bench()
    # std = scale * 0.02 * sqrt(H): H = 100 -> 8 / (0.02 * 10) = 40
    assert bench.final_norm_scale(100) == pytest.approx(40.0)
    assert bench.final_norm_scale(400, logit_std=4.0, init_std=0.1) == pytest.approx(2.0)


def test_ratio_rows_against_the_last_engine():
    bench = load_bench()
    rows = bench.ratio_rows({"vllm": {"tokens_per_s": 300.0}, "hf": {"tokens_per_s": 100.0}}, "hf")
    assert rows == [("vllm", 300.0, 3.0), ("hf", 100.0, 1.0)]
    assert math.isnan(bench.ratio_rows({"hf": {"tokens_per_s": 0.0}}, "hf")[0][2])
    per_cpu = {"vllm": {"tokens_per_cpu_s": 50.0}, "hf": {"tokens_per_cpu_s": 20.0}}
    assert bench.ratio_rows(per_cpu, "hf", "tokens_per_cpu_s") == [("vllm", 50.0, 2.5), ("hf", 20.0, 1.0)]


def test_bad_engine_name_is_refused_naming_the_choices(tmp_path):
    bench = load_bench()
    with pytest.raises(SystemExit, match="choose from vllm, hf"):
        bench.main(["--engines", "vllm,sglang", "--work", str(tmp_path)])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_script_runs_both_engines_with_equal_token_counts(tmp_path, tiny_assets):
    pytest.importorskip("vllm")
    work = tmp_path / "work"
    work.mkdir()
    (work / "assets").symlink_to(tiny_assets.root)  # reused: the child finds the manifest
    out = tmp_path / "figures.json"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--engines",
            "vllm,hf",
            "--shape",
            "tiny",
            "--prompts",
            "2",
            "--group-size",
            "2",
            "--max-new-tokens",
            "8",
            "--max-turns",
            "1",
            "--work",
            str(work),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=850,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["same_token_counts"] is True
    results = figures["results"]
    assert list(results) == ["vllm", "hf"]
    for name, r in results.items():
        turns = r["turns"]
        assert turns % 4 == 0 and turns >= 4, (name, r)  # 2 prompts x 2, every trajectory the same number of turns
        assert r["turn_tokens"] == {"8": turns}, (name, r)  # every turn ran to max_new_tokens
        assert r["generated_tokens"] == 8 * turns and r["tokens_per_s"] > 0 and r["tokens_per_cpu_s"] > 0
        assert set(r["finish_reasons"]) == {"length"} and r["searches"] == 0
    assert set(results["vllm"]["time_s"]) == {"schedule", "forward", "sample", "update", "outputs"}
    assert results["vllm"]["calls"]["forward"] >= 8  # at least one step per generated token of a turn
    assert "vs hf" in proc.stdout and "same token counts on every engine: yes" in proc.stdout
