"""The Search-R1 evaluation tables checked against ``generations.jsonl``, recomputed here independently (deliberately
not with ``rlinf_ext.rewards``): shared by the in-process evaluation tests and the reference recipe's end-to-end test
(not a test module itself)."""

from __future__ import annotations

import csv
import json
import re
import string
from pathlib import Path

import pytest

from rlinf_ext.eval.searchr1.benchmarks import PAPER_ORDER, display_name


def normalize(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(w for w in s.split() if w not in ("a", "an", "the"))


def recompute_em(rows: list[dict]) -> dict[str, float]:
    """EM per benchmark: the last answer of the model's own turns against any gold answer."""
    per: dict[str, list[float]] = {}
    for row in rows:
        own_text = "".join(t["output"] for t in row["turns"])
        answers = re.findall(r"<answer>(.*?)</answer>", own_text, re.DOTALL)
        hit = bool(answers) and any(normalize(answers[-1]) == normalize(g) for g in row["golden_answers"])
        per.setdefault(row["benchmark"], []).append(float(hit))
    return {b: sum(v) / len(v) for b, v in per.items()}


def check_tables_against_generations(run_dir: Path, n_per_bench: int) -> dict[str, float]:
    """results.{json,csv,md} of ``run_dir`` hold the EM recomputed from its generations, seven benchmarks of
    ``n_per_bench`` questions each in the paper's order; returns the EM per benchmark."""
    rows = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    em = recompute_em(rows)
    assert sorted(em) == sorted(PAPER_ORDER) and all(
        len([r for r in rows if r["benchmark"] == b]) == n_per_bench for b in em
    )
    results = json.loads((run_dir / "results.json").read_text())
    assert list(results["benchmarks"]) == list(PAPER_ORDER)
    for bench, value in em.items():
        assert results["benchmarks"][bench]["em"] == pytest.approx(value)
        assert results["benchmarks"][bench]["n"] == n_per_bench
    average = sum(em.values()) / len(em)
    assert results["average"]["em"] == pytest.approx(average)
    table = list(csv.DictReader((run_dir / "results.csv").open()))
    assert [r["benchmark"] for r in table] == [display_name(b) for b in PAPER_ORDER] + ["average", "overall"]
    for r, bench in zip(table, PAPER_ORDER):
        assert float(r["EM"]) == pytest.approx(em[bench], abs=5e-4) and int(r["n"]) == n_per_bench
    assert float(table[7]["EM"]) == pytest.approx(average, abs=5e-4)
    assert (
        f"| EM | {' | '.join(f'{em[b]:.3f}' for b in PAPER_ORDER)} | {average:.3f} |"
        in (run_dir / "results.md").read_text()
    )
    return em
