"""Stopping an evaluation halfway and rerunning it: finished questions are skipped, not redone."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from eval_helpers import decode_stub, make_trajectory

from rlinf_ext.eval.core.generations import read_generations
from rlinf_ext.eval.searchr1.dataset import EvalItem
from rlinf_ext.eval.searchr1.records import GenerationRecord
from rlinf_ext.eval.searchr1.runner import evaluate_async


class Killed(BaseException):
    """Stands in for Ctrl-C / SIGTERM arriving while questions are in flight."""


def _cfg(concurrency: int):
    return SimpleNamespace(
        data=SimpleNamespace(val_rollout_batch_size=concurrency, rollout_batch_size=99),
        reward=None,
    )


def _items() -> list[EvalItem]:
    items = [EvalItem("popqa", f"p{i}", f"q{i}", f"prompt {i}", [f"ans{i}"]) for i in range(6)]
    items += [EvalItem("nq", f"n{i}", f"q{i}", f"prompt {i}", [f"ans{i}"]) for i in range(4)]
    return items


def _scripted_rollout(calls: list[str], kill_at: int | None = None, fail: set[str] = frozenset()):
    """Correct answer for even-numbered ids, wrong for odd ones; optionally die at the `kill_at`-th call."""

    async def rollout(item: EvalItem):
        calls.append(item.item_id)
        if kill_at is not None and len(calls) == kill_at:
            raise Killed()
        if item.item_id in fail:
            raise ConnectionError("engine unreachable")
        await asyncio.sleep(0)
        n = int(item.item_id[1:])
        answer = item.golden_answers[0] if n % 2 == 0 else "wrong"
        return make_trajectory([f"<answer>{answer}</answer>"])

    return rollout


def _run(items, rollout, run_dir, concurrency=1):
    return asyncio.run(
        evaluate_async(
            _cfg(concurrency), items, rollout, decode_stub, run_dir, {"experiment_name": "t"}, show_progress=False
        )
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 3])
def test_interrupted_run_resumes_without_redoing(tmp_path, concurrency):
    items = _items()
    first_calls: list[str] = []
    with pytest.raises(Killed):
        _run(items, _scripted_rollout(first_calls, kill_at=5), tmp_path, concurrency)
    saved = read_generations(tmp_path / "generations.jsonl", GenerationRecord)
    assert 1 <= len(saved) <= 4  # whatever finished before the kill, and nothing else
    assert not (tmp_path / "results.json").exists()

    second_calls: list[str] = []
    summary = _run(items, _scripted_rollout(second_calls), tmp_path, concurrency)
    done_before = {r.item_id for r in saved}
    assert set(second_calls) == {it.item_id for it in items} - done_before  # nothing redone
    assert summary.resumed == len(saved) and summary.evaluated == len(items) - len(saved)

    # Same numbers as an uninterrupted run: popqa p0,p2,p4 correct of 6; nq n0,n2 of 4.
    res = json.loads((tmp_path / "results.json").read_text())
    assert list(res["benchmarks"]) == ["nq", "popqa"]
    assert res["benchmarks"]["popqa"]["em"] == pytest.approx(3 / 6)
    assert res["benchmarks"]["nq"]["em"] == pytest.approx(2 / 4)
    assert res["overall"]["n"] == 10 and res["overall"]["em"] == pytest.approx(5 / 10)
    assert len(read_generations(tmp_path / "generations.jsonl", GenerationRecord)) == 10


@pytest.mark.timeout(60)
def test_failed_questions_are_reported_then_retried(tmp_path):
    items = _items()
    summary = _run(items, _scripted_rollout([], fail={"p0", "n1"}), tmp_path)
    assert summary.errors == 2
    assert summary.aggregate.benchmarks["popqa"].errors == 1
    assert summary.aggregate.benchmarks["popqa"].em == pytest.approx(2 / 6)  # p0 counted as wrong

    calls: list[str] = []
    summary = _run(items, _scripted_rollout(calls), tmp_path)
    assert sorted(calls) == ["n1", "p0"]
    assert summary.aggregate.overall.errors == 0
    assert summary.aggregate.benchmarks["popqa"].em == pytest.approx(3 / 6)


@pytest.mark.timeout(60)
def test_smaller_data_size_on_rerun_reports_only_the_current_questions(tmp_path):
    items = _items()
    _run(items, _scripted_rollout([]), tmp_path)
    calls: list[str] = []
    subset = [it for it in items if it.item_id in {"p0", "p1", "n0"}]
    summary = _run(subset, _scripted_rollout(calls), tmp_path)
    assert calls == []
    assert summary.aggregate.overall.n == 3
    assert summary.aggregate.benchmarks["popqa"].em == pytest.approx(1 / 2)
