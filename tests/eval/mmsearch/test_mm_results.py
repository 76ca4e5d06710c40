"""The MMSearch-R1 results table on hand-made records (values computed by hand)."""

from __future__ import annotations

import json

import pytest

from rlinf_ext.eval.core.generations import GenerationsWriter, completed_keys, read_generations
from rlinf_ext.eval.mmsearch.records import GenerationRecord, TurnLog
from rlinf_ext.eval.mmsearch.results import table, write_results


def rec(item, source, category, correct, reward, image=0, text=0, image_fail=0, error=None):
    turns = [TurnLog("image_search", "x", tool="image", search_ok=not image_fail)] * image + [
        TurnLog("text_search", "y", tool="text", query="q", search_ok=True)
    ] * text
    return GenerationRecord(
        "test",
        item,
        "q?",
        source,
        category,
        ["a"],
        turns=turns,
        scores={"correct": correct, "reward": reward},
        image_searches=image,
        text_searches=text,
        image_search_failures=image_fail,
        error=error,
    )


RECORDS = [
    rec("1", "tinymm_colour", "search_free", 1.0, 1.0),
    rec("2", "tinymm_colour", "search_free", 1.0, 0.91, image=1),
    rec("3", "tinymm_city", "search_required", 0.0, 0.1, image=1, image_fail=1),
    rec("4", "tinymm_attribute", "search_required", 1.0, 0.91, image=1, text=1),
]


def test_table_rows_by_hand():
    rows = {(r["data_source"], r["category"]): r for r in table(RECORDS)}
    colour = rows[("tinymm_colour", "search_free")]
    assert colour["n"] == 2 and colour["accuracy"] == 1.0 and colour["reward"] == pytest.approx(0.955)
    assert colour["search_ratio_image"] == 0.5 and colour["search_ratio_any"] == 0.5
    overall = rows[("all", "all")]
    assert overall["n"] == 4 and overall["accuracy"] == 0.75 and overall["reward"] == pytest.approx(2.92 / 4)
    assert (overall["search_ratio_image"], overall["search_ratio_text"], overall["search_ratio_mix"]) == (
        0.5,
        0.0,
        0.25,
    )
    assert overall["image_search_failure_ratio"] == pytest.approx(1 / 3) and overall["text_search_failure_ratio"] == 0.0
    assert list(rows)[-1] == ("all", "all") and ("tinymm_city", "all") in rows


def test_records_round_trip_resume_keys_and_files(tmp_path):
    path = tmp_path / "generations.jsonl"
    with GenerationsWriter(path) as w:
        for r in RECORDS + [rec("5", "tinymm_city", "search_required", 0.0, 0.0, error="RuntimeError: boom")]:
            w.write(r)
    back = read_generations(path, GenerationRecord)
    assert back[:4] == RECORDS and back[4].error
    assert completed_keys(back) == {("test", str(i)) for i in range(1, 5)}  # the failed one is retried
    paths = write_results(tmp_path, table(back), {"model_path": "m"})
    data = json.loads(paths["results.json"].read_text())
    assert data["rows"][-1]["n"] == 5 and data["rows"][-1]["accuracy"] == pytest.approx(3 / 5)
    assert paths["results.csv"].read_text().startswith("data_source,category,n,accuracy")
