"""Writers for results.json, results.md and results.csv in a run directory."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rlinf_ext.eval.benchmarks import display_name
from rlinf_ext.eval.scoring import Aggregate, BenchmarkResult

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RESULTS_CSV = "results.csv"

# (column header, BenchmarkResult field, format) for the detail tables.
DETAIL_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("n", "n", "{:d}"),
    ("EM", "em", "{:.3f}"),
    ("subEM", "subem", "{:.3f}"),
    ("F1", "f1", "{:.3f}"),
    ("searches", "mean_searches", "{:.2f}"),
    ("turns", "mean_turns", "{:.2f}"),
    ("resp_tokens", "mean_response_length", "{:.1f}"),
    ("search_failures", "search_failures", "{:d}"),
    ("errors", "errors", "{:d}"),
)
SCORE_ROWS: tuple[tuple[str, str], ...] = (("EM", "em"), ("subEM", "subem"), ("F1", "f1"))


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return ""
    if fmt.endswith("d}"):
        return fmt.format(int(round(value)))
    return fmt.format(value)


def detail_rows(agg: Aggregate) -> list[list[str]]:
    """One row per benchmark (paper order), then `average` (mean over benchmarks) and `overall` (pooled)."""
    rows = []
    for bench, res in agg.benchmarks.items():
        rows.append([display_name(bench)] + [_cell(getattr(res, f), fmt) for _, f, fmt in DETAIL_COLUMNS])
    avg = [_cell(agg.average.get(f), fmt) if f in agg.average else "" for _, f, fmt in DETAIL_COLUMNS]
    rows.append(["average"] + avg)
    rows.append(["overall"] + [_cell(getattr(agg.overall, f), fmt) for _, f, fmt in DETAIL_COLUMNS])
    return rows


def paper_table_rows(agg: Aggregate) -> tuple[list[str], list[list[str]]]:
    """The paper's shape: a column per benchmark plus Avg, a row per score."""
    header = ["metric"] + [display_name(b) for b in agg.benchmarks] + ["Avg"]
    rows = []
    for label, field in SCORE_ROWS:
        rows.append([label] + [f"{getattr(r, field):.3f}" for r in agg.benchmarks.values()] + [f"{agg.average[field]:.3f}"])
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_results(run_dir: str | Path, agg: Aggregate, meta: dict[str, Any]) -> dict[str, Path]:
    """Write the three result files; `meta` (model, config, sampling, ...) goes into results.json and the md."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: run_dir / name for name in (RESULTS_JSON, RESULTS_MD, RESULTS_CSV)}

    payload = {"meta": meta, **agg.to_json()}
    paths[RESULTS_JSON].write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    detail_header = ["benchmark"] + [h for h, _, _ in DETAIL_COLUMNS]
    with paths[RESULTS_CSV].open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(detail_header)
        writer.writerows(detail_rows(agg))

    header, rows = paper_table_rows(agg)
    md = [f"# Evaluation: {meta.get('experiment_name', run_dir.name)}", ""]
    md += [f"- {k}: `{v}`" for k, v in meta.items() if not isinstance(v, (dict, list))]
    md += ["", "## Scores (paper layout; Avg = mean over benchmarks)", "", markdown_table(header, rows)]
    md += ["", "## Per benchmark", "", markdown_table(detail_header, detail_rows(agg)), ""]
    paths[RESULTS_MD].write_text("\n".join(md), encoding="utf-8")
    return paths


def load_results(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / RESULTS_JSON
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: RUN_DIR must be an evaluation run directory (run `rlinf-ext eval` first)"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def benchmark_result_from_json(row: dict) -> BenchmarkResult:
    return BenchmarkResult(**row)
