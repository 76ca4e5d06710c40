"""The reference recipe (examples/searchr1/README.md §2) is ``examples/searchr1/reference_recipe.sh``, and CI runs it.

1. The README's step block is the script's marked lines (``reference_recipe.sh --readme``), character for character,
   and names only verbs and scripts that exist.
2. ``reference_recipe.sh tiny DIR`` as a user runs it (the project's environment on PATH): the download replaced by
   the same files generated offline at tiny size in the published formats (Search-R1's ``e5_Flat.index``,
   ``wiki-18.jsonl.gz``, an encoder folder, ``train.parquet`` and ONE merged ``test.parquet`` with seven
   ``data_source``s), then every step of the README: adopt the index, serve it, preprocess both parquet files, train
   2 steps (validating first on the merged test set, grouped by ``data_source``), convert, evaluate into the training
   run's output directory (the tiny model on vLLM against the recipe's running server: the tables checked against
   the generations, recomputed independently) and ``eval-report`` with the seven benchmarks.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from eval_tables import check_tables_against_generations
from launch_helpers import metrics_rows

from rlinf_ext.cli import VERBS
from rlinf_ext.eval.searchr1.benchmarks import DISPLAY_NAMES, PAPER_ORDER

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "searchr1" / "reference_recipe.sh"
README = REPO / "examples" / "searchr1" / "README.md"
README_MARK = "<!-- the lines below are `bash examples/searchr1/reference_recipe.sh --readme` -->"
STEP_RE = re.compile(r"^# (\d)\) ", re.M)


def readme_block(text: str) -> str:
    """The bash block right after the README's marker comment."""
    found = re.search(re.escape(README_MARK) + r"\n```bash\n(.*?)```\n", text, re.S)
    assert found, f"examples/searchr1/README.md: no ```bash block right after {README_MARK!r}"
    return found.group(1)


def script_block() -> str:
    return subprocess.run(["bash", str(SCRIPT), "--readme"], capture_output=True, text=True, check=True).stdout


def test_the_readme_lists_the_scripts_steps():
    block = script_block()
    assert readme_block(README.read_text()) == block, (
        "examples/searchr1/README.md §2 and reference_recipe.sh differ: paste the output of "
        "`bash examples/searchr1/reference_recipe.sh --readme` into the README's block")
    assert [int(n) for n in STEP_RE.findall(block)] == list(range(1, 8))
    verbs = set(re.findall(r"^rlinf-ext ([\w-]+)", block, re.M))
    assert verbs == {"adopt-index", "serve-retriever", "preprocess", "validate", "convert", "eval-report"}
    assert verbs <= set(VERBS), f"verbs the CLI does not have: {sorted(verbs - set(VERBS))}"
    for rel in re.findall(r"\$REPO/(\S+)", block):
        assert (REPO / rel).exists(), rel


def test_a_changed_readme_step_is_caught():
    text = README.read_text()
    changed = text.replace("--topk 3 --device cpu &", "--topk 5 --device cpu &")
    assert changed != text and readme_block(changed) != script_block()


def _environment() -> dict[str, str]:
    """The project's environment activated, as the README asks: its python and rlinf-ext first on PATH, this
    checkout's code first on the import path."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["VIRTUAL_ENV"] = sys.prefix
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _port_is_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_tiny_recipe_runs_every_step(tmp_path):
    work = tmp_path / "work"
    started = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPT), "tiny", str(work)], capture_output=True, text=True, env=_environment(),
                          cwd=str(tmp_path), timeout=880)
    out = proc.stdout + proc.stderr
    print(f"reference_recipe.sh tiny: {time.monotonic() - started:.1f} s")
    assert proc.returncode == 0, out[-6000:]

    # 1) the inputs, in the published formats
    test_rows = pq.read_table(work / "data" / "nq_hotpotqa_train" / "test.parquet").to_pylist()
    assert list(dict.fromkeys(r["data_source"] for r in test_rows)) == list(PAPER_ORDER)
    # 3) the server over the adopted index answered, and is gone with the script
    port = int(re.search(r"retrieval server: .* listening on http://127\.0\.0\.1:(\d+)", out).group(1))
    assert _port_is_closed(port)
    # 4) one prompt file per parquet file, every source kept
    test_jsonl = [json.loads(x) for x in (work / "searchr1_data" / "test.jsonl").read_text().splitlines()]
    assert [r["data_source"] for r in test_jsonl] == [r["data_source"] for r in test_rows]

    # 5) two steps, after a validation that grouped the merged test set by data_source (one question each)
    run_dir = work / "runs" / "searchr1-grpo-tiny-recipe"
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["val/n"] == 7 and rows[0]["val/errors"] == 0
    assert all(f"val/{bench}/em" in rows[0] for bench in PAPER_ORDER)
    assert sum(r["agent/searches"] for r in rows[1:]) > 0, "the agent never searched the adopted index"
    assert (run_dir / "checkpoints" / "global_step_2" / "actor").is_dir()
    # 6) the converted model
    assert (work / "models" / "searchr1-grpo-tiny-recipe" / "config.json").is_file()

    # 7) the evaluation wrote into the training run's output directory, where eval-report read it
    eval_dir = work / "runs" / "searchr1-eval-tiny-recipe"
    check_tables_against_generations(eval_dir, 1)
    generations = [json.loads(x) for x in (eval_dir / "generations.jsonl").read_text().splitlines()]
    assert all(g["error"] is None and g["turns"] and g["response_length"] > 0 for g in generations)
    header = "| run | " + " | ".join(DISPLAY_NAMES[b] for b in PAPER_ORDER) + " | Avg | n |"
    report = out[out.rindex(header):]
    assert re.search(r"^\| searchr1-eval-tiny-recipe \|( \d\.\d{3} \|){8} 7 \|$", report, re.M), report
    assert "| Search-R1 paper: Qwen2.5-3B-Instruct GRPO |" in report, report
