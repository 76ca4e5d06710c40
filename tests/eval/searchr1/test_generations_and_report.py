"""generations.jsonl round trip and torn-write handling; eval-report tables; benchmark file reading."""

from __future__ import annotations

import json

import pytest
from test_scoring import hand_made_records

from rlinf_ext.cli import main as cli_main
from rlinf_ext.eval.core.generations import (
    GenerationsWriter,
    completed_keys,
    read_generations,
)
from rlinf_ext.eval.searchr1.benchmarks import (
    benchmark_from_path,
    canonical_benchmark,
    paper_sorted,
)
from rlinf_ext.eval.searchr1.dataset import load_eval_items
from rlinf_ext.eval.searchr1.records import GenerationRecord, error_record
from rlinf_ext.eval.searchr1.report import comparison_table
from rlinf_ext.eval.searchr1.results import write_results
from rlinf_ext.eval.searchr1.scoring import aggregate


def test_round_trip_latest_record_wins_and_errors_are_not_completed(tmp_path):
    path = tmp_path / "generations.jsonl"
    records = hand_made_records()
    failed = error_record(records[0].__class__(**{**records[0].__dict__, "item_id": "9"}), RuntimeError("x"))
    with GenerationsWriter(path) as w:
        for r in records:
            w.write(r)
        w.write(failed)
    back = read_generations(path, GenerationRecord)
    assert [r.key for r in back] == [r.key for r in records] + [failed.key]
    assert back[1].turns[0].observation == records[1].turns[0].observation
    assert failed.key not in completed_keys(back)
    assert records[0].key in completed_keys(back)

    # the errored question redone later: one record for it, the successful one
    redone = records[0].__class__(**{**records[0].__dict__, "item_id": "9"})
    with GenerationsWriter(path) as w:
        w.write(redone)
    back = read_generations(path, GenerationRecord)
    assert len(back) == len(records) + 1
    assert back[-1].error is None and back[-1].key == failed.key


def test_torn_last_line_is_ignored_and_cut_before_appending(tmp_path):
    path = tmp_path / "generations.jsonl"
    records = hand_made_records()
    with GenerationsWriter(path) as w:
        w.write(records[0])
    with path.open("a") as fh:
        fh.write('{"benchmark": "nq", "item_id"')  # killed mid-write
    assert [r.key for r in read_generations(path, GenerationRecord)] == [records[0].key]
    with GenerationsWriter(path) as w:
        w.write(records[1])
    assert [r.key for r in read_generations(path, GenerationRecord)] == [records[0].key, records[1].key]


def test_corrupt_line_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "generations.jsonl"
    good = json.dumps(hand_made_records()[0].to_json())
    path.write_text(good + "\nnot json\n" + good + "\n")
    with pytest.raises(ValueError, match="generations.jsonl:2"):
        read_generations(path, GenerationRecord)


def test_benchmark_names():
    assert canonical_benchmark("2wiki") == "2wikimultihopqa"
    assert canonical_benchmark("HotpotQA") == "hotpotqa"
    assert canonical_benchmark("gsm8k") is None
    assert benchmark_from_path("/d/test/nq.parquet") == "nq"
    assert benchmark_from_path("/d/mine.jsonl") == "mine"
    assert paper_sorted(["mine", "bamboogle", "nq", "popqa"]) == ["nq", "popqa", "bamboogle", "mine"]


def test_eval_report_side_by_side_with_paper(tmp_path, capsys):
    records = hand_made_records()
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    settings = {"max_turns": 4, "precision": "bf16", "on_no_action": "retry", "topk": 3}
    write_results(run_a, aggregate(records), {"experiment_name": "a", **settings})
    write_results(run_b, aggregate([r for r in records if r.benchmark == "nq"]), {"experiment_name": "b"})
    header, rows = comparison_table([run_a, run_b], with_paper=True)
    assert header[:8] == ["run", "NQ", "TriviaQA", "PopQA", "HotpotQA", "2Wiki", "MuSiQue", "Bamboogle"]
    assert header[-3:] == ["Avg", "n", "settings"]
    assert rows[0][:5] == ["a", "0.333", "-", "-", "0.500"] and rows[0][-3:-1] == ["0.417", "5"]
    # the settings that move EM: a run's own; '?' where a run did not record them; Search-R1's evaluate.sh
    assert rows[0][-1] == "4 search turns, bf16, EOS without action: retry, top-3"
    assert rows[1][4] == "-" and rows[1][-3] == "0.333"
    assert rows[1][-1] == "? search turns, ?, EOS without action: ?, top-?"
    grpo = rows[2]
    assert grpo[1:8] == ["0.397", "0.565", "0.391", "0.331", "0.310", "0.124", "0.232"] and grpo[8] == "0.336"
    assert grpo[-1] == rows[0][-1] and rows[-1][-1] == "-"  # Search-o1: not Search-R1's pipeline
    assert (
        "## Scores (paper layout; Avg = mean over benchmarks; 4 search turns, bf16, EOS without action: retry, "
        "top-3)" in (run_a / "results.md").read_text()
    )

    assert cli_main(["eval-report", str(run_a), str(run_b), "--with-paper"]) == 0
    out = capsys.readouterr().out
    assert "| a | 0.333 |" in out and "Qwen2.5-3B-Instruct GRPO" in out
    assert cli_main(["eval-report", str(run_a), "--metric", "f1"]) == 0
    assert "| a | 0.556 |" in capsys.readouterr().out  # NQ F1 = 5/9
    assert cli_main(["eval-report", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert "results.json" in err and "runner.output_dir" in err and "evaluation results:" in err


def test_run_labels_tell_same_named_runs_apart(tmp_path):
    from rlinf_ext.eval.searchr1.report import run_labels

    assert run_labels([tmp_path / "x" / "eval", tmp_path / "y" / "eval"]) == ["x/eval", "y/eval"]
    assert run_labels([tmp_path / "x", tmp_path / "y"]) == ["x", "y"]


def test_load_items_from_both_formats_with_data_size(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet_rows = [
        {
            "data_source": src,
            "prompt": [{"role": "user", "content": f"Question: q{i}?\n"}],
            "reward_model": {"ground_truth": {"target": [f"a{i}"]}},
        }
        for i, src in enumerate(["nq", "nq", "nq", "popqa", "popqa"])
    ]
    pq.write_table(pa.Table.from_pylist(parquet_rows), tmp_path / "test.parquet")
    (tmp_path / "bamboogle.jsonl").write_text(
        "\n".join(
            json.dumps({"prompt": f"<chat>Question: b{i}?\n", "solutions": [f"s{i}"], "uid": f"b-{i}"})
            for i in range(3)
        )
    )

    def render(msgs):
        return "<chat>" + msgs[0]["content"]

    items = load_eval_items([str(tmp_path / "test.parquet"), str(tmp_path / "bamboogle.jsonl")], render, data_size=2)
    assert [(i.benchmark, i.item_id) for i in items] == [
        ("nq", "test.parquet#0"),
        ("nq", "test.parquet#1"),
        ("popqa", "test.parquet#3"),
        ("popqa", "test.parquet#4"),
        ("bamboogle", "b-0"),
        ("bamboogle", "b-1"),
    ]
    assert items[0].prompt == "<chat>Question: q0?\n" and items[0].question == "q0?"
    assert items[4].golden_answers == ["s0"] and items[4].question == "b0?"

    with pytest.raises(ValueError, match="data.answer_key"):
        load_eval_items([str(tmp_path / "bamboogle.jsonl")], render, answer_key="golden")
    with pytest.raises(FileNotFoundError, match="val_data_paths"):
        load_eval_items([str(tmp_path / "nope.jsonl")], render)


def test_rows_are_grouped_by_their_data_source_even_outside_the_seven(tmp_path):
    # one merged file: a data_source that is not one of the seven is its own benchmark, not the file's name
    rows = [
        {"prompt": f"Question: q{i}?\n", "solutions": ["a"], "data_source": src, "uid": f"u{i}"}
        for i, src in enumerate(["nq", "strategyqa", "natural_questions", "strategyqa", ""])
    ]
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    items = load_eval_items([str(tmp_path / "test.jsonl")], lambda msgs: msgs[0]["content"])
    assert [i.benchmark for i in items] == ["nq", "strategyqa", "nq", "strategyqa", "test"]
