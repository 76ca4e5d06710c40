"""The toy third agent (``examples/plugins/arith/agent.py``), added with no edit to ``rlinf_ext/``: its YAML validates
with its own section and tool, its reward scores numbers, and it trains 2 steps of the tiny experiment through the
real launcher (Ray workers, the agent loop with the calculator, the reward worker, the Megatron actor)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from examples.plugins.arith.agent import SPEC, arith_reward
from rlinf_ext.config import check_config

REPO = Path(__file__).resolve().parents[3]
YAML = REPO / "examples" / "plugins" / "arith" / "arith-tiny.yaml"
QUESTIONS = [("2*(3+4)", 14), ("10-7", 3), ("6/4", 1.5), ("5+5*2", 15)]


def write_questions(path: Path) -> Path:
    """RLinf jsonl rows ({prompt, solutions}), the prompt already formatted (data.apply_chat_template=false)."""
    rows = [
        {
            "prompt": f"<|im_start|>user\nWhat is {q}? Use <calculate> expression </calculate>, then give "
            f"<answer> number </answer>.<|im_end|>\n<|im_start|>assistant\n",
            "solutions": [str(a)],
        }
        for q, a in QUESTIONS
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_yaml_validates_with_its_own_section_and_tool(tmp_path):
    data = write_questions(tmp_path / "train.jsonl")
    checked = check_config(YAML, [f"data.train_data_paths=[{data}]"])
    assert checked.ok, [str(i) for i in checked.issues]
    section = checked.cfg.agentloop.arith
    assert section.tools == ["examples.plugins.calculator.tool:Calculator"] and section.max_turns == 2
    assert pickle.loads(pickle.dumps(checked.cfg)) == checked.cfg  # the agent's schema class is found by name
    bad = check_config(YAML, [f"data.train_data_paths=[{data}]", "agentloop.arith.tools=[calculator]"])
    assert any(i.key == "agentloop.arith.tools" and "neither a registered tool" in i.reason for i in bad.issues)


def test_the_reward_scores_the_last_answer_as_a_number():
    assert arith_reward("<answer> 14.0 </answer>", ["14"]).score == 1.0
    assert arith_reward("<answer>13</answer> then <answer>1.5</answer>", ["1.5"]).score == 1.0
    assert arith_reward("<answer> fourteen </answer>", ["14"]).score == 0.0
    assert arith_reward("no answer", ["14"]).em == 0.0
    assert SPEC.name == "arith"


@pytest.mark.slow
def test_two_steps_of_the_tiny_experiment(tiny_assets, tmp_path):
    data = write_questions(tmp_path / "train.jsonl")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)  # the Ray workers
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlinf_ext.cli",
            "train",
            str(YAML),
            "--no-progress",
            f"data.train_data_paths=[{data}]",
            f"paths.tiny_assets={tiny_assets.root}",
            f"rollout.model.model_path={tiny_assets.qwen2_tiny}",
            f"runner.output_dir={tmp_path / 'runs'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=420,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [
        json.loads(line) for line in (tmp_path / "runs" / "arith-grpo-tiny" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [0, 1] or [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert "agent/calculator_calls" in row and "agent/searches" not in row  # the agent's tool, not search
        assert 0.0 <= row["reward/mean"] <= 1.0
