"""Side-by-side table of several evaluation runs, optionally with the published Search-R1 rows."""

from __future__ import annotations

from pathlib import Path

from rlinf_ext.eval.core.results import load_results, markdown_table
from rlinf_ext.eval.searchr1.benchmarks import PAPER_ORDER, display_name, paper_sorted
from rlinf_ext.eval.searchr1.paper import PUBLISHED_ROWS
from rlinf_ext.eval.searchr1.results import settings_label

METRICS = ("em", "subem", "f1")


def run_labels(run_dirs: list[Path]) -> list[str]:
    """The shortest trailing path parts that tell the runs apart (`a/eval`, `b/eval`; else just `eval`)."""
    parts = [Path(d).resolve().parts for d in run_dirs]
    for k in range(1, max((len(p) for p in parts), default=1) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(d) for d in run_dirs]  # the same directory given twice


def comparison_table(
    run_dirs: list[str | Path], metric: str = "em", with_paper: bool = False
) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per run (and published row), a column per benchmark plus Avg."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric '{metric}'; choose one of {', '.join(METRICS)}")
    runs = [(Path(d), load_results(d)) for d in run_dirs]
    benches = paper_sorted(
        [b for _, res in runs for b in res["benchmarks"]] + (list(PAPER_ORDER) if with_paper else [])
    )
    header = ["run"] + [display_name(b) for b in benches] + ["Avg", "n", "settings"]
    rows: list[list[str]] = []
    for label, (path, res) in zip(run_labels([p for p, _ in runs]), runs):
        cells = [f"{res['benchmarks'][b][metric]:.3f}" if b in res["benchmarks"] else "-" for b in benches]
        rows.append(
            [label]
            + cells
            + [f"{res['average'][metric]:.3f}", str(res["overall"]["n"]), settings_label(res.get("meta", {}))]
        )
    if with_paper:
        if metric != "em":
            raise ValueError("the paper publishes EM only; use --metric em with --with-paper")
        for row in PUBLISHED_ROWS:
            cells = [f"{row.em[b]:.3f}" if b in row.em else "-" for b in benches]
            rows.append(
                [row.label] + cells + [f"{row.avg:.3f}", "-", settings_label(row.settings) if row.settings else "-"]
            )
    return header, rows


def render_report(run_dirs: list[str | Path], metric: str = "em", with_paper: bool = False) -> str:
    header, rows = comparison_table(run_dirs, metric=metric, with_paper=with_paper)
    note = (
        f"{metric.upper() if metric == 'em' else metric} per benchmark; Avg = mean over the benchmarks each run "
        "evaluated; settings = search turns, engine precision, the rule for an EOS without an action, top-k."
    )
    return markdown_table(header, rows) + "\n\n" + note
