"""The Search-R1 results: per-benchmark detail rows and the paper-layout score table in results.{json,md,csv}."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlinf_ext.eval.core.results import RESULTS_MD, markdown_table, write_result_files
from rlinf_ext.eval.searchr1.benchmarks import display_name
from rlinf_ext.eval.searchr1.records import GenerationRecord
from rlinf_ext.eval.searchr1.scoring import Aggregate, aggregate

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
# (meta key, label) of the evaluation settings that move EM, stated with every score table
SETTINGS: tuple[tuple[str, str], ...] = (
    ("max_turns", "{} search turns"),
    ("precision", "{}"),
    ("on_no_action", "EOS without action: {}"),
    ("topk", "top-{}"),
)


def settings_label(meta: dict[str, Any]) -> str:
    """The run's settings that move EM in one line; ``?`` for one a run did not record (written before it was)."""
    return ", ".join(
        label.format(meta[key]) if meta.get(key) is not None else label.format("?") for key, label in SETTINGS
    )


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
        rows.append(
            [label] + [f"{getattr(r, field):.3f}" for r in agg.benchmarks.values()] + [f"{agg.average[field]:.3f}"]
        )
    return header, rows


def write_results(run_dir: str | Path, agg: Aggregate, meta: dict[str, Any]) -> dict[str, Path]:
    """Write the three result files; `meta` (model, config, sampling, ...) goes into results.json and the md."""
    run_dir = Path(run_dir)
    detail_header = ["benchmark"] + [h for h, _, _ in DETAIL_COLUMNS]
    header, rows = paper_table_rows(agg)
    md = [f"# Evaluation: {meta.get('experiment_name', run_dir.name)}", ""]
    md += [f"- {k}: `{v}`" for k, v in meta.items() if not isinstance(v, (dict, list))]
    md += [
        "",
        f"## Scores (paper layout; Avg = mean over benchmarks; {settings_label(meta)})",
        "",
        markdown_table(header, rows),
    ]
    md += ["", "## Per benchmark", "", markdown_table(detail_header, detail_rows(agg)), ""]
    return write_result_files(run_dir, {"meta": meta, **agg.to_json()}, "\n".join(md), detail_header, detail_rows(agg))


def tabulate(
    run_dir: Path, records: list[GenerationRecord], meta: dict[str, Any]
) -> tuple[Aggregate, dict[str, Path], str]:
    """The run's `Tabulate` (``eval.core.loop``): aggregate, result files, and results.md as the table."""
    agg = aggregate(records)
    paths = write_results(run_dir, agg, meta)
    return agg, paths, paths[RESULTS_MD].read_text(encoding="utf-8")
