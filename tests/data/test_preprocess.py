"""Preprocessing: Search-R1 parquet / RLinf jsonl -> RLinf jsonl with unique uids and a length filter."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import EXAMPLE_YAML, read_jsonl

from rlinf_ext.cli import main
from rlinf_ext.data.preprocess import (
    PreprocessError,
    build_user_message,
    parse_row,
    preprocess_files,
    question_from_prompt,
)
from rlinf_ext.data.prompt_config import PromptConfig, load_prompt_config, with_tool_instructions


def test_question_recovery_and_template():
    assert question_from_prompt([{"role": "user", "content": "... Question: Who is X?\n"}], "Question: ") == "Who is X?"
    assert question_from_prompt("<|im_start|>user\nQuestion: a\n<|im_end|>", "Question: ") == "a"
    with pytest.raises(PreprocessError, match="question_marker"):
        question_from_prompt("no marker here", "Question: ")
    cfg = PromptConfig()
    assert build_user_message("who wrote it", cfg).endswith("Question: who wrote it?\n")
    assert build_user_message("who wrote it?", cfg).endswith("Question: who wrote it?\n")


def test_parse_row_layouts():
    searchr1 = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "Question: q1\n"}],
        "reward_model": {"ground_truth": {"target": ["A", "B"]}},
        "extra_info": {"index": 7},
    }
    assert parse_row(searchr1, "Question: ", "f").__dict__ == dict(
        question="q1", answers=["A", "B"], data_source="nq", source_id="7"
    )
    rlinf = {"prompt": "Question: q2\n", "solutions": ["C"]}
    parsed = parse_row(rlinf, "Question: ", "myfile")
    assert (parsed.question, parsed.answers, parsed.data_source, parsed.source_id) == ("q2", ["C"], "myfile", None)
    with pytest.raises(PreprocessError, match="no answers"):
        parse_row({"question": "q"}, "Question: ", "f")


def test_searchr1_parquet_matches_rlinf_layout(tiny_assets, tokenizer, tmp_path):
    out = tmp_path / "train.jsonl"
    report = preprocess_files(
        [tiny_assets.searchr1_train], out, load_prompt_config(EXAMPLE_YAML), tokenizer, show_progress=False
    )
    rows = read_jsonl(out)
    reference = read_jsonl(tiny_assets.rlinf_train)
    assert report.read == report.written == len(rows) == len(reference)
    # same prompt text and answers as the assets' RLinf jsonl (made independently from the same questions)
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in reference]
    assert [r["solutions"] for r in rows] == [r["solutions"] for r in reference]
    assert len({r["uid"] for r in rows}) == len(rows)
    assert set(report.by_source) == {r["data_source"] for r in rows}


def test_uids_unique_when_indices_restart_per_dataset(tokenizer, tmp_path):
    # Search-R1's extra_info.index restarts per dataset and files may repeat ids
    rows = [
        {
            "data_source": ds,
            "prompt": [{"role": "user", "content": f"Question: q{i}{ds}\n"}],
            "reward_model": {"ground_truth": {"target": ["x"]}},
            "extra_info": {"index": i % 2},
        }
        for ds in ("nq", "hotpotqa")
        for i in range(4)
    ]
    src = tmp_path / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    out = tmp_path / "out.jsonl"
    preprocess_files([src], out, PromptConfig(), tokenizer, show_progress=False)
    uids = [r["uid"] for r in read_jsonl(out)]
    assert uids == ["nq-0", "nq-1", "nq-0#1", "nq-1#1", "hotpotqa-0", "hotpotqa-1", "hotpotqa-0#1", "hotpotqa-1#1"]


def test_length_filter_counts_dropped(tiny_assets, tokenizer, tmp_path):
    cfg = PromptConfig()
    lengths = []
    for row in read_jsonl(tiny_assets.rlinf_train):
        lengths.append(len(tokenizer.encode(row["prompt"], add_special_tokens=False)))
    limit = sorted(lengths)[len(lengths) // 2]
    expected_dropped = sum(1 for n in lengths if n > limit)
    assert 0 < expected_dropped < len(lengths)
    out = tmp_path / "short.jsonl"
    cfg.max_prompt_length = limit
    report = preprocess_files([tiny_assets.rlinf_train], out, cfg, tokenizer, show_progress=False)
    assert report.too_long == expected_dropped and report.written == len(lengths) - expected_dropped
    assert report.max_prompt_tokens <= limit
    # rlinf jsonl input keeps its uids (prefixed by the source)
    assert all(r["uid"].startswith(r["data_source"] + "-") for r in read_jsonl(out))


def test_cli_and_errors(tiny_assets, tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    rc = main(
        [
            "preprocess",
            "--config",
            str(EXAMPLE_YAML),
            "--input",
            str(tiny_assets.searchr1_test["nq"]),
            "--output",
            str(out),
            "--tokenizer",
            str(tiny_assets.tokenizer_dir),
            "--no-progress",
        ]
    )
    assert rc == 0 and "wrote" in capsys.readouterr().out and out.exists()
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("tempalte: x\n")
    with pytest.raises(ValueError, match="unknown prompt settings"):
        load_prompt_config(bad_yaml)
    with pytest.raises(ValueError, match="{question}"):
        PromptConfig(template="no placeholder")
    rc = main(
        [
            "preprocess",
            "--input",
            str(tmp_path / "missing.parquet"),
            "--output",
            str(out),
            "--tokenizer",
            str(tiny_assets.tokenizer_dir),
            "--no-progress",
        ]
    )
    assert rc == 1 and "does not exist" in capsys.readouterr().err


def test_the_documented_input_rows_parse_as_documented():
    """docs/extending.md shows the rows `rlinf-ext preprocess` reads: each parses, with the question and answers
    the doc implies."""
    import json
    import re
    from pathlib import Path

    from rlinf_ext.data.preprocess import parse_row

    doc = (Path(__file__).resolve().parents[2] / "docs" / "extending.md").read_text()
    block = re.search(r"```jsonl\n(.*?)```", doc, re.S).group(1)
    rows = [parse_row(json.loads(line), "Question:", "default") for line in block.splitlines() if line.strip()]
    assert [(r.question, r.answers, r.data_source, r.source_id) for r in rows] == [
        ("What is 3 + 11?", ["14"], "arith", "q1"),
        ("Who wrote Hamlet?", ["Shakespeare"], "default", None),
    ]


CALCULATOR = "examples.plugins.calculator.tool:Calculator"
ARITH_YAML = EXAMPLE_YAML.parents[1] / "plugins" / "arith" / "arith-tiny.yaml"


def test_the_tools_instructions_fill_their_placeholder(tiny_assets, tmp_path, capsys):
    cfg = PromptConfig(template="Solve it. {tool_instructions} Question: {question}\n", tools=["search", CALCULATOR])
    user = build_user_message("2+3", with_tool_instructions(cfg))
    assert user == (
        "Solve it. If I want to search, I should put the query between <search> and </search>. If I want "
        "to calculate, I should put the expression between <calculate> and </calculate>. Question: 2+3?\n"
    )
    with pytest.raises(ValueError, match=r"Fix: put \{tool_instructions\} in the template"):
        PromptConfig(tools=["search"])  # Search-R1's template has no placeholder
    with pytest.raises(ValueError, match="Fix: list the tools"):
        PromptConfig(template="{tool_instructions} {question}")
    with pytest.raises(ValueError, match="neither a registered tool.*Fix: use one of"):
        with_tool_instructions(PromptConfig(template="{tool_instructions} {question}", tools=["calc"]))
    # the command: the user's own prompt YAML names the placeholder, --tools the tools of their experiment
    own = tmp_path / "prompt.yaml"
    own.write_text('template: "{tool_instructions} Question: {question}\\n"\napply_chat_template: false\n')
    out = tmp_path / "tools.jsonl"

    def first_prompt(*tools_args: str) -> str:
        cli = ["preprocess", "--config", str(own), *tools_args, "--input", str(tiny_assets.searchr1_test["nq"])]
        rc = main([*cli, "--output", str(out), "--tokenizer", str(tiny_assets.tokenizer_dir), "--no-progress"])
        assert rc == 0, capsys.readouterr().err
        return read_jsonl(out)[0]["prompt"]

    prompt = first_prompt("--tools", f"search,{CALCULATOR}")
    assert prompt.startswith("If I want to search,") and "<calculate> and </calculate>. Question: " in prompt
    # or the tools an experiment configures (the arithmetic agent's: the calculator alone)
    assert first_prompt("--experiment", str(ARITH_YAML)).startswith(
        "If I want to calculate, I should put the expression between"
    )
