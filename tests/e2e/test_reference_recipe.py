"""The reference recipe (examples/searchr1/README.md §2) is ``examples/searchr1/reference_recipe.sh``, and CI runs it.

1. The README's step block is the script's marked lines (``reference_recipe.sh --readme``), character for character,
   and names only verbs and scripts that exist.
2. ``reference_recipe.sh tiny DIR`` as a user runs it (the project's environment on PATH): the download replaced by
   the same files generated offline at tiny size in the published formats (Search-R1's ``e5_Flat.index``,
   ``wiki-18.jsonl.gz``, an encoder folder, ``train.parquet`` and ONE merged ``test.parquet`` with seven
   ``data_source``s), then every step of the README: adopt the index, serve it, preprocess both parquet files, train
   2 steps on vLLM (validating first on the merged test set, grouped by ``data_source``; weights synced into the
   running engine), convert, evaluate into the training run's output directory (the tiny model on vLLM against the
   recipe's running server: the tables checked against the generations, recomputed independently) and
   ``eval-report`` with the seven benchmarks.
3. Extending that finished run, the most common use of resume (one launch fewer than a run of its own): the launcher
   serves the adopted index itself this time, ``runner.max_steps=4 runner.resume_dir=auto`` resumes at step 2, and
   after step 3 the test kills the server: searches then fail (counted) and training still finishes. The launcher
   evaluates the new model into ``eval/global_step_4/``, the recipe's evaluation stays as it was, the summary says
   where the run resumed from and covers the whole run, and the converted model loads and generates.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from launch_helpers import launch, metrics_rows, when_step_logged

from rlinf_ext.cli import VERBS
from rlinf_ext.eval.searchr1.benchmarks import DISPLAY_NAMES, PAPER_ORDER
from tests.support.eval_tables import check_tables_against_generations

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "searchr1" / "reference_recipe.sh"
README = REPO / "examples" / "searchr1" / "README.md"
README_MARK = "<!-- the lines below are `bash examples/searchr1/reference_recipe.sh --readme` -->"
STEP_RE = re.compile(r"^# (\d)\) ", re.M)
CONFIG = "tiny-recipe"
SERVER_RE = re.compile(r"retrieval server: .* listening on http://127\.0\.0\.1:(\d+)")
LAUNCHED_SERVER_RE = re.compile(r"retrieval server on http://([\d.]+):(\d+) \(pid (\d+)")


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
        "`bash examples/searchr1/reference_recipe.sh --readme` into the README's block"
    )
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


# ---------------------------------------------------------------- the tiny run
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


@dataclass
class RecipeRun:
    work: Path
    code: int
    log: str
    seconds: float

    @property
    def run_dir(self) -> Path:
        return self.work / "runs" / f"searchr1-grpo-{CONFIG}"

    @property
    def eval_dir(self) -> Path:
        return self.work / "runs" / f"searchr1-eval-{CONFIG}"


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> RecipeRun:
    work = tmp_path_factory.mktemp("recipe") / "work"
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", str(SCRIPT), "tiny", str(work)],
        capture_output=True,
        text=True,
        env=_environment(),
        cwd=str(work.parent),
        timeout=880,
    )
    run = RecipeRun(work, proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)
    (work.parent / "recipe.log").write_text(run.log)  # kept for a failure's reading (pytest's basetemp)
    print(f"reference_recipe.sh tiny: {run.seconds:.1f} s")
    return run


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_tiny_recipe_runs_every_step(recipe):
    assert recipe.code == 0, recipe.log[-6000:]
    work, log = recipe.work, recipe.log

    # 1) the inputs, in the published formats
    test_rows = pq.read_table(work / "data" / "nq_hotpotqa_train" / "test.parquet").to_pylist()
    assert list(dict.fromkeys(r["data_source"] for r in test_rows)) == list(PAPER_ORDER)
    # 3) the server over the adopted index answered, and is gone with the script
    assert _port_is_closed(int(SERVER_RE.search(log).group(1)))
    # 4) one prompt file per parquet file, every source kept
    test_jsonl = [json.loads(x) for x in (work / "searchr1_data" / "test.jsonl").read_text().splitlines()]
    assert [r["data_source"] for r in test_jsonl] == [r["data_source"] for r in test_rows]

    # 5) two steps on vLLM, after a validation that grouped the merged test set by data_source (one question each)
    run_dir = recipe.run_dir
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    val = rows[0]
    assert val["val/n"] == 7 and val["val/errors"] == 0 and math.isfinite(val["val/all/em"])
    assert all(f"val/{bench}/em" in val for bench in PAPER_ORDER) and "reward/mean" not in val
    assert len((run_dir / "validation" / "global_step_0" / "generations.jsonl").read_text().splitlines()) == 7
    for row in rows[1:]:
        for key in ("reward/mean", "actor/loss", "agent/searches", "time/step"):
            assert key in row and math.isfinite(row[key]), (key, row)
    assert sum(r["agent/searches"] for r in rows[1:]) > 0, "the agent never searched the adopted index"
    assert (run_dir / "checkpoints" / "global_step_2" / "actor").is_dir()
    assert (run_dir / "reward_curve.png").is_file()
    rollouts = run_dir / "rollouts"  # tiny-recipe.yaml keeps every step's trajectories
    assert sorted(p.name for p in rollouts.glob("step_*.jsonl")) == ["step_1.jsonl", "step_2.jsonl"]
    traj = json.loads((rollouts / "step_1.jsonl").read_text().splitlines()[0])
    assert traj["response_text"] and "reward" in traj
    assert "finished: 2 step(s)" in log and "converted HF     : " in log
    # vLLM: each weight sync resets the engine's prefix cache (step 2's, after step 1's update, at least)
    assert "Successfully reset prefix cache" in log
    assert math.isfinite(val["time/rollout_start"]) and rows[2]["time/sync"] > 0
    # 6) the converted model
    assert (work / "models" / f"searchr1-grpo-{CONFIG}" / "config.json").is_file()

    # 7) the evaluation wrote into the training run's output directory, where eval-report read it
    check_tables_against_generations(recipe.eval_dir, 1)
    generations = [json.loads(x) for x in (recipe.eval_dir / "generations.jsonl").read_text().splitlines()]
    assert all(g["error"] is None and g["turns"] and g["response_length"] > 0 for g in generations)
    header = "| run | " + " | ".join(DISPLAY_NAMES[b] for b in PAPER_ORDER) + " | Avg | n | settings |"
    report = log[log.rindex(header) :]
    # the settings column: the tiny recipe's (1 turn, fp32 on CPU, Search-R1's EOS rule, top-1)
    assert re.search(
        rf"^\| searchr1-eval-{CONFIG} \|( \d\.\d{{3}} \|){{8}} 7 \| "
        r"1 search turns, fp32, EOS without action: retry, top-1 \|$",
        report,
        re.M,
    ), report
    assert "| Search-R1 paper: Qwen2.5-3B-Instruct GRPO |" in report, report


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_extending_the_recipes_run_survives_a_dead_server_and_evaluates_each_model(recipe):
    assert recipe.code == 0, "the recipe itself failed (see test_the_tiny_recipe_runs_every_step)"
    work, run_dir = recipe.work, recipe.run_dir
    recipe_results = json.loads((recipe.eval_dir / "results.json").read_text())
    env = {
        **_environment(),
        "RLINF_EXT_SEARCHR1_DATA": str(work / "searchr1_data"),
        "RLINF_EXT_RETRIEVER_ADDR": "127.0.0.1:1",
    }  # unused: the launcher starts its own server
    served_by_launcher = [
        "retrieval.launch=true",
        "retrieval.retriever=e5",
        f"retrieval.index_dir={work / 'index' / 'e5_flat'}",
        f"retrieval.corpus_path={work / 'wiki-18.jsonl'}",
        f"retrieval.model_path={work / 'models' / 'e5-base-v2'}",
        "tools.search.server_addr=null",
    ]
    server: dict = {}

    def note_server_pid(line: str, _proc) -> None:
        if m := LAUNCHED_SERVER_RE.search(line):
            server["pid"] = int(m.group(3))

    def kill_server():
        os.kill(server["pid"], signal.SIGKILL)  # the pid line comes long before step 3
        server["killed"] = True

    watch = when_step_logged(run_dir, 3, kill_server)
    # the evaluation of the new model (one question per benchmark) then runs against the dead server too; every
    # search there still makes its retries, with short backoffs (the default's 0.5-2 s waits are idle CI time)
    short_backoff = "tools.search.backoff_base=0.05"
    code, log = launch(
        [
            "--eval",
            "--eval-override",
            "data.data_size=1",
            "--eval-override",
            short_backoff,
            short_backoff,
            f"rollout.model.model_path={work / 'models' / 'qwen2-tiny-sft-search'}",
            f"runner.output_dir={work / 'runs'}",
            *served_by_launcher,
            "runner.max_steps=4",
            "runner.resume_dir=auto",
        ],
        on_line=note_server_pid,
        env=env,
        config=CONFIG,
    )
    watch.finish()
    assert code == 0, log[-4000:]
    assert server.get("killed"), "the test never saw step 3 and did not kill the server"
    rows = {r["step"]: r for r in metrics_rows(run_dir)}
    assert sorted(rows) == [0, 1, 2, 3, 4], "the extension did not continue at step 3 (or validated again at step 0)"
    assert rows[4]["agent/search_failures"] > 0, "searches against a dead server were not counted as failures"
    assert math.isfinite(rows[4]["actor/loss"])
    assert (run_dir / "checkpoints" / "global_step_4").is_dir()
    # the new model is evaluated beside the run; the recipe's evaluation stays as it was
    results = json.loads((run_dir / "eval" / "global_step_4" / "results.json").read_text())
    assert results["overall"]["n"] == 7 and results["overall"]["errors"] == 0  # one question per benchmark
    assert f"eval table       : {run_dir / 'eval' / 'global_step_4' / 'results.md'}" in log
    assert json.loads((recipe.eval_dir / "results.json").read_text()) == recipe_results
    # the summary covers the whole run: 4 steps, step 1's reward (the recipe's launch) as the first window
    assert f"resumed from {run_dir / 'checkpoints' / 'global_step_2'}" in log
    assert "finished: 4 step(s)" in log
    assert f"first 1 vs last 1 step(s): {rows[1]['reward/mean']:.3f} -> {rows[4]['reward/mean']:.3f}" in log

    # the converted HF model loads and generates
    hf_dir = run_dir / "hf_model" / "global_step_4"
    assert f"converted HF     : {hf_dir}" in log
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    ids = tok("Question: who wrote it?", return_tensors="pt").input_ids
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] > ids.shape[1]
    assert torch.isfinite(model(ids).logits).all()
