"""`rlinf-ext eval tiny-mm-cpu-eval` end to end on CPU: the warm-started tiny Qwen2.5-VL, the FVQA test file, the
image-search cache and a BM25 server the eval launcher starts itself (over an index it builds when missing) and stops
at the end; the table is recomputed from generations.jsonl by hand, and a rerun resumes without rolling anything out
again. (The Search-R1 evaluation through the same launcher, against a running server: step 7 of
tests/e2e/test_reference_recipe.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
QUESTIONS = 6


def _run(root, out_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RLINF_EXT_EVAL_MODEL")}
    res = subprocess.run(
        [
            "bash",
            str(REPO / "examples" / "mmsearch" / "run_main_mmsearch_eval.sh"),
            "tiny-mm-cpu-eval",
            "--no-progress",
            f"paths.tiny_assets={root}",
            f"runner.output_dir={out_dir}",
            f"data.data_size={QUESTIONS}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
        cwd="/",
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return res.stdout + res.stderr


def _recompute(generations: list[dict]) -> dict[tuple[str, str], dict[str, float]]:
    """The table from the per-turn logs alone (tools used, their success), not from the record counters."""
    groups = defaultdict(list)
    for g in generations:
        for key in ((g["data_source"], g["category"]), (g["data_source"], "all"), ("all", "all")):
            groups[key].append(g)
    table = {}
    for key, gs in groups.items():
        kinds, fails, calls = [], {"image": 0, "text": 0}, {"image": 0, "text": 0}
        for g in gs:
            tools = {t["tool"] for t in g["turns"] if t["tool"]}
            kinds.append("mix" if tools == {"image", "text"} else tools.pop() if tools else "none")
            for t in g["turns"]:
                if t["tool"]:
                    calls[t["tool"]] += 1
                    fails[t["tool"]] += t["search_ok"] is False
        n = len(gs)
        table[key] = {
            "n": n,
            "accuracy": sum(g["scores"]["correct"] for g in gs) / n,
            "reward": sum(g["scores"]["reward"] for g in gs) / n,
            "search_ratio_image": kinds.count("image") / n,
            "search_ratio_text": kinds.count("text") / n,
            "search_ratio_mix": kinds.count("mix") / n,
            "search_ratio_any": 1 - kinds.count("none") / n,
            "image_search_failure_ratio": fails["image"] / calls["image"] if calls["image"] else 0.0,
            "text_search_failure_ratio": fails["text"] / calls["text"] if calls["text"] else 0.0,
        }
    return table


@pytest.mark.timeout(900)
def test_tiny_mm_evaluation_end_to_end_and_resume(tiny_mm_assets_sft, tmp_path):
    out = _run(tiny_mm_assets_sft.root, tmp_path)
    run_dir = tmp_path / "mmsearch-r1-eval-tiny-cpu"
    generations = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    assert len(generations) == QUESTIONS and all(g["error"] is None for g in generations)
    results = json.loads((run_dir / "results.json").read_text())
    expected = _recompute(generations)
    assert {(r["data_source"], r["category"]) for r in results["rows"]} == set(expected)
    for row in results["rows"]:
        want = expected[(row["data_source"], row["category"])]
        for name, value in want.items():
            assert row[name] == pytest.approx(value), (row["data_source"], row["category"], name)
    # the warm start follows the protocol: it searches images (real cache). The emblem world has no question that
    # needs a text search and its warm start writes none; a text search, if any, went to the real BM25 server
    turns = [t for g in generations for t in g["turns"]]
    assert any(t["tool"] == "image" and t["search_ok"] and len(t["image_sha1s"]) == 3 for t in turns)
    assert all(t["search_ok"] and t["query"] for t in turns if t["tool"] == "text")
    assert results["meta"]["image_search"]["backend"] == "cache_dir" and "retrieval server" in out
    pid = int(re.search(r"retrieval server on http://\S+ \(pid (\d+)", out).group(1))
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert (run_dir / "results.md").read_text().startswith("| data source | category |")
    again = _run(tiny_mm_assets_sft.root, tmp_path)
    assert f"0 question(s) evaluated, {QUESTIONS} resumed" in again
    assert json.loads((run_dir / "results.json").read_text())["rows"] == results["rows"]
