"""The shared evaluation loop (``eval/core/loop.py``) with a made-up agent: resume, retries, progress bars in
order, an interruption that leaves no rollout running, and the run's tabulation of every saved record."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlinf_ext.eval.core.generations import GenerationsWriter, read_generations
from rlinf_ext.eval.core.loop import Evaluator, evaluate_items, evaluate_run
from rlinf_ext.eval.core.records import EvalRecord
from rlinf_ext.eval.core.results import markdown_table, write_result_files


@dataclass
class ToyTurn:
    output: str


@dataclass
class ToyRecord(EvalRecord):
    TURN = ToyTurn
    REQUIRED = ("benchmark", "item_id")

    benchmark: str
    item_id: str
    turns: list[ToyTurn] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    error: str | None = None


class Killed(BaseException):
    pass


def toy_evaluator(calls: list[str], fail=frozenset(), kill_at=None, started=None, cancelled=None) -> Evaluator:
    async def rollout(item):
        bench, n = item
        calls.append(f"{bench}{n}")
        if kill_at is not None and len(calls) == kill_at:
            raise Killed()
        if f"{bench}{n}" in fail:
            raise ConnectionError("down")
        if started is not None:
            started.append(n)
        try:
            await asyncio.sleep(0.01 * (n % 3))
        except asyncio.CancelledError:
            if cancelled is not None:
                cancelled.append(n)
            raise
        return n % 2 == 0

    return Evaluator(
        record_type=ToyRecord,
        key=lambda item: (item[0], str(item[1])),
        rollout=rollout,
        record=lambda item, ok: ToyRecord(item[0], str(item[1]), [ToyTurn("x")], {"ok": float(ok)}),
        error_record=lambda item, exc: ToyRecord(item[0], str(item[1]), error=repr(exc)),
        bars=lambda items: [(b, [it for it in items if it[0] == b]) for b in ("b", "a")],
        postfix=lambda recs: {"ok": f"{sum(r.scores.get('ok', 0.0) for r in recs) / len(recs):.2f}"},
    )


def tabulate(run_dir: Path, records: list[ToyRecord], meta: dict):
    n_ok = sum(r.scores.get("ok", 0.0) for r in records)
    md = markdown_table(["n", "ok"], [[str(len(records)), f"{n_ok:.0f}"]])
    paths = write_result_files(
        run_dir, {"meta": meta, "n": len(records), "ok": n_ok}, md, ["n", "ok"], [[len(records), n_ok]]
    )
    return n_ok, paths, md


ITEMS = [("a", i) for i in range(4)] + [("b", i) for i in range(3)]


def _run(evaluator, run_dir, concurrency=2):
    return asyncio.run(evaluate_run(ITEMS, evaluator, tabulate, run_dir, {"m": 1}, concurrency, show_progress=False))


@pytest.mark.timeout(60)
def test_bars_in_order_errors_retried_and_resume(tmp_path):
    calls: list[str] = []
    first = _run(toy_evaluator(calls, fail={"a1"}), tmp_path)
    assert [c[0] for c in calls] == ["b"] * 3 + ["a"] * 4  # one bar after another, in the evaluator's order
    assert (first.evaluated, first.resumed, first.errors) == (7, 0, 1)
    saved = read_generations(tmp_path / "generations.jsonl", ToyRecord)
    assert len(saved) == 7 and saved[0].turns == [ToyTurn("x")]

    calls.clear()
    second = _run(toy_evaluator(calls), tmp_path)
    assert calls == ["a1"] and (second.evaluated, second.resumed, second.errors) == (1, 6, 0)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"] == {"m": 1, "questions": 7, "resumed": 6} and res["n"] == 7 and res["ok"] == 4.0
    assert second.aggregate == 4.0 and second.table_md == (tmp_path / "results.md").read_text()


@pytest.mark.timeout(60)
def test_interruption_keeps_finished_records_and_cancels_the_rest(tmp_path):
    started: list[int] = []
    cancelled: list[int] = []
    with pytest.raises(Killed):
        _run(toy_evaluator([], kill_at=5, started=started, cancelled=cancelled), tmp_path, concurrency=3)
    saved = read_generations(tmp_path / "generations.jsonl", ToyRecord)
    assert 1 <= len(saved) <= 4 and not (tmp_path / "results.json").exists()
    assert set(cancelled) <= set(started)  # whatever was in flight was cancelled, not left running

    calls: list[str] = []
    summary = _run(toy_evaluator(calls), tmp_path)
    assert set(calls) == {f"{b}{n}" for b, n in ITEMS} - {r.benchmark + r.item_id for r in saved}
    assert summary.resumed == len(saved) and summary.aggregate == 4.0


def test_concurrency_must_be_positive(tmp_path):
    with GenerationsWriter(tmp_path / "g.jsonl") as w, pytest.raises(ValueError, match="concurrency"):
        asyncio.run(evaluate_items(ITEMS, toy_evaluator([]), w, concurrency=0))


def test_a_line_of_another_agent_is_refused(tmp_path):
    (tmp_path / "g.jsonl").write_text(json.dumps({"item_id": "1"}) + "\n")
    with pytest.raises(ValueError, match="lacks \\['benchmark'\\].*ToyRecord"):
        read_generations(tmp_path / "g.jsonl", ToyRecord)
