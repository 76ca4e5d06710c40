"""Aggregation of per-question scores into per-benchmark, pooled and benchmark-averaged results.

How one answer is scored (EM / subEM / F1) is the rewards package's business; this module only averages
the numbers already stored on each record, so it is pure and testable on hand-made records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from rlinf_ext.eval.searchr1.benchmarks import paper_sorted
from rlinf_ext.eval.searchr1.records import SCORE_NAMES, GenerationRecord


@dataclass
class BenchmarkResult:
    n: int
    em: float
    subem: float
    f1: float
    mean_searches: float
    mean_turns: float
    mean_response_length: float
    search_failures: int  # failed search calls, summed
    errors: int  # questions whose rollout raised (scored 0)

    def to_json(self) -> dict:
        return asdict(self)


# Columns averaged across benchmarks for the "average" row (the paper's Avg is the mean of per-benchmark EM).
AVERAGED_FIELDS: tuple[str, ...] = SCORE_NAMES + ("mean_searches", "mean_turns", "mean_response_length")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def score_of(record: GenerationRecord, name: str) -> float:
    """A record's score; an errored record (no scores) counts 0 so failures never inflate accuracy."""
    if record.error is not None and name not in record.scores:
        return 0.0
    if name not in record.scores:
        raise ValueError(f"record {record.key} has no '{name}' score (has {sorted(record.scores)})")
    return float(record.scores[name])


def summarize(records: list[GenerationRecord]) -> BenchmarkResult:
    return BenchmarkResult(
        n=len(records),
        em=_mean([score_of(r, "em") for r in records]),
        subem=_mean([score_of(r, "subem") for r in records]),
        f1=_mean([score_of(r, "f1") for r in records]),
        mean_searches=_mean([r.num_searches for r in records]),
        mean_turns=_mean([r.num_turns for r in records]),
        mean_response_length=_mean([r.response_length for r in records]),
        search_failures=sum(r.search_failures for r in records),
        errors=sum(1 for r in records if r.error is not None),
    )


@dataclass
class Aggregate:
    benchmarks: dict[str, BenchmarkResult]  # in the paper's order
    overall: BenchmarkResult  # every question pooled (micro average)
    average: dict[str, float]  # unweighted mean over benchmarks (macro; the paper's "Avg")

    def to_json(self) -> dict:
        return {
            "benchmarks": {b: r.to_json() for b, r in self.benchmarks.items()},
            "overall": self.overall.to_json(),
            "average": dict(self.average),
        }


def aggregate(records: Iterable[GenerationRecord]) -> Aggregate:
    """Group records by benchmark, summarise each, pool them all, and average the benchmarks."""
    by_bench: dict[str, list[GenerationRecord]] = {}
    for r in records:
        by_bench.setdefault(r.benchmark, []).append(r)
    per = {b: summarize(by_bench[b]) for b in paper_sorted(by_bench)}
    everything = [r for rs in by_bench.values() for r in rs]
    average = {f: _mean([getattr(res, f) for res in per.values()]) for f in AVERAGED_FIELDS}
    return Aggregate(benchmarks=per, overall=summarize(everything), average=average)
