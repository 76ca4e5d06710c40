"""EM / subEM / F1 per benchmark, pooled and averaged, on hand-made generations with hand-computed values."""

from __future__ import annotations

import csv
import json

import pytest
from eval_helpers import decode_stub, make_trajectory

from rlinf_ext.eval.searchr1.dataset import EvalItem
from rlinf_ext.eval.searchr1.records import error_record, record_from_trajectory
from rlinf_ext.eval.searchr1.results import write_results
from rlinf_ext.eval.searchr1.scoring import aggregate


def _item(bench: str, i: int, golds: list[str]) -> EvalItem:
    return EvalItem(benchmark=bench, item_id=str(i), question=f"q{i}", prompt=f"p{i}", golden_answers=golds)


def hand_made_records():
    # Written hotpotqa first: the aggregate must still come out in the paper's order (NQ before HotpotQA).
    cases = [
        # HotpotQA 1: articles and case are normalised away -> EM 1, subEM 1, F1 1
        (
            _item("hotpotqa", 1, ["eiffel tower"]),
            make_trajectory(["<search>x</search>", "<answer> The Eiffel Tower </answer>"], [True]),
        ),
        # HotpotQA 2: "tower" vs "eiffel tower": EM 0, subEM 0, F1 = 2*(1*1/2)/(1+1/2) = 2/3; a failed search
        (
            _item("hotpotqa", 2, ["eiffel tower", "x"]),
            make_trajectory(["<search>a</search>", "<search>b</search>", "<answer>tower</answer>"], [False, True]),
        ),
        # NQ 1: exact -> 1, 1, 1
        (_item("nq", 1, ["Paris"]), make_trajectory(["<answer>Paris</answer>"])),
        # NQ 2: "Paris France" vs "Paris": EM 0, subEM 1, F1 = 2*(1/2*1)/(1/2+1) = 2/3
        (_item("nq", 2, ["Paris"]), make_trajectory(["<answer>Paris, France.</answer>"])),
        # NQ 3: no answer tag (the prompt's example answer must not count) -> 0, 0, 0
        (_item("nq", 3, ["Beijing"]), make_trajectory(["I think Beijing"])),
    ]
    return [record_from_trajectory(item, traj, decode_stub) for item, traj in cases]


def test_per_record_scores_and_turn_logs():
    records = hand_made_records()
    by_key = {r.key: r for r in records}
    hp2 = by_key[("hotpotqa", "2")]
    assert hp2.scores["em"] == 0.0 and hp2.scores["subem"] == 0.0
    assert hp2.scores["f1"] == pytest.approx(2 / 3)
    assert hp2.final_answer == "tower"
    assert (hp2.num_turns, hp2.num_searches, hp2.search_failures) == (3, 2, 1)
    assert hp2.response_length == 5 + 3 + 5 + 3 + 5
    assert [t.observation for t in hp2.turns] == [decode_stub([100, 101, 102])] * 2 + [None]
    assert by_key[("nq", "3")].final_answer is None


def test_aggregate_per_benchmark_pooled_and_average():
    agg = aggregate(hand_made_records())
    assert list(agg.benchmarks) == ["nq", "hotpotqa"]
    nq, hp = agg.benchmarks["nq"], agg.benchmarks["hotpotqa"]
    assert (nq.n, hp.n) == (3, 2)
    assert nq.em == pytest.approx(1 / 3) and nq.subem == pytest.approx(2 / 3) and nq.f1 == pytest.approx(5 / 9)
    assert hp.em == pytest.approx(1 / 2) and hp.subem == pytest.approx(1 / 2) and hp.f1 == pytest.approx(5 / 6)
    assert hp.mean_searches == pytest.approx(3 / 2) and hp.mean_turns == pytest.approx(5 / 2)
    assert hp.search_failures == 1 and nq.search_failures == 0
    # the paper's Avg: mean over benchmarks
    assert agg.average["em"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert agg.average["subem"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert agg.average["f1"] == pytest.approx((5 / 9 + 5 / 6) / 2)
    # pooled over the five questions
    assert agg.overall.n == 5
    assert agg.overall.em == pytest.approx(2 / 5)
    assert agg.overall.subem == pytest.approx(3 / 5)
    assert agg.overall.f1 == pytest.approx((1 + 2 / 3 + 0 + 1 + 2 / 3) / 5)


def test_errored_question_counts_as_zero_not_dropped():
    records = hand_made_records() + [error_record(_item("nq", 4, ["Rome"]), RuntimeError("engine died"))]
    nq = aggregate(records).benchmarks["nq"]
    assert nq.n == 4 and nq.errors == 1
    assert nq.em == pytest.approx(1 / 4)


def test_result_files(tmp_path):
    agg = aggregate(hand_made_records())
    paths = write_results(tmp_path, agg, {"experiment_name": "unit", "model_path": "/m"})
    data = json.loads(paths["results.json"].read_text())
    assert data["benchmarks"]["nq"]["em"] == pytest.approx(1 / 3)
    assert data["average"]["em"] == pytest.approx(5 / 12)
    assert data["meta"]["model_path"] == "/m"

    rows = list(csv.DictReader(paths["results.csv"].open()))
    assert [r["benchmark"] for r in rows] == ["NQ", "HotpotQA", "average", "overall"]
    assert float(rows[0]["EM"]) == pytest.approx(1 / 3, abs=5e-4)
    assert float(rows[2]["EM"]) == pytest.approx(5 / 12, abs=5e-4)
    assert float(rows[3]["F1"]) == pytest.approx(2 / 3, abs=5e-4)
    assert rows[1]["search_failures"] == "1"

    md = paths["results.md"].read_text()
    assert "| metric | NQ | HotpotQA | Avg |" in md
    assert "| EM | 0.333 | 0.500 | 0.417 |" in md
