"""The MMSearch-R1 evaluator on the shared loop (``eval.core.loop``) with made-up trajectories: records, the
per-source table from every saved record, and a rerun that rolls nothing out again."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from rlinf_ext.agent.mmsearch.types import Task
from rlinf_ext.eval.core.generations import read_generations
from rlinf_ext.eval.core.loop import evaluate_run
from rlinf_ext.eval.mmsearch.records import GenerationRecord
from rlinf_ext.eval.mmsearch.results import tabulate
from rlinf_ext.eval.mmsearch.runner import evaluator

TASKS = [
    ("test", Task(str(i), f"q{i}", (), ("a",), "search_required" if i % 2 else "search_free", "tinymm"))
    for i in range(4)
]


def _trajectory(task: Task):
    correct = int(task.data_id) % 2 == 0
    turn = SimpleNamespace(
        action="image_search",
        text="<search><img></search>",
        tool="image",
        query=None,
        titles=[],
        observation_images=[],
        tool_ok=True,
        observation_ids=[7, 7, 8],
    )
    metrics = {
        "image_searches": 1,
        "text_searches": 0,
        "image_search_failures": 0,
        "text_search_failures": 0,
        "missing_images": 0,
    }
    reward = SimpleNamespace(
        answer="a" if correct else "b",
        correct=correct,
        em=float(correct),
        subem=float(correct),
        format_score=1.0,
        score=float(correct),
    )
    return SimpleNamespace(
        turns=[turn], reward_details=reward, metrics=metrics, response_ids=[1, 2, 3], end_reason="answer"
    )


@pytest.mark.timeout(60)
def test_mm_evaluator_runs_resumes_and_tabulates(tmp_path):
    calls: list[str] = []

    async def rollout(task: Task):
        calls.append(task.data_id)
        if task.data_id == "3" and len(calls) <= 4:
            raise ConnectionError("image search down")
        return _trajectory(task)

    decode = lambda ids: "".join("<|image_pad|>" if i == 7 else "x" for i in ids)  # noqa: E731

    def run():
        return asyncio.run(
            evaluate_run(
                TASKS,
                evaluator(rollout, decode),
                tabulate,
                tmp_path,
                {"model_path": "m"},  # noqa: E731
                concurrency=2,
                show_progress=False,
            )
        )

    first = run()
    assert (first.evaluated, first.resumed, first.errors) == (4, 0, 1)
    second = run()
    assert (second.evaluated, second.resumed, second.errors) == (1, 3, 0) and calls[4:] == ["3"]
    records = read_generations(tmp_path / "generations.jsonl", GenerationRecord)
    assert all(r.error is None for r in records)
    assert records[0].turns[0].observation == "<|image_pad|>x"  # pad runs collapsed to one
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    overall = rows[-1]
    assert (overall["data_source"], overall["category"], overall["n"]) == ("all", "all", 4)
    assert overall["accuracy"] == 0.5 and overall["search_ratio_image"] == 1.0
    assert second.table_md.startswith("| data source | category |") and second.aggregate == rows
