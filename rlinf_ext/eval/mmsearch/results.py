"""The MMSearch-R1 results table: one row per (data source, category), one per data source, one overall."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlinf_ext.agent.mmsearch.metrics import TABLE_COLUMNS, table_summary
from rlinf_ext.eval.core.results import markdown_table, write_result_files
from rlinf_ext.eval.mmsearch.records import GenerationRecord

ALL = "all"
COLUMNS = ("data_source", "category", "n", *TABLE_COLUMNS)


def table(records: Sequence[GenerationRecord]) -> list[dict[str, Any]]:
    """Rows `{data_source, category, n, <TABLE_COLUMNS>}`; erroring questions count with score 0."""
    groups: dict[tuple[str, str], list[GenerationRecord]] = {}
    for r in records:
        for key in ((r.data_source, r.category), (r.data_source, ALL)):
            groups.setdefault(key, []).append(r)
    rows = [
        _row(src, cat, recs)
        for (src, cat), recs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] == ALL, kv[0][1]))
    ]
    if records:
        rows.append(_row(ALL, ALL, list(records)))
    return rows


def _row(source: str, category: str, records: list[GenerationRecord]) -> dict[str, Any]:
    return {
        "data_source": source,
        "category": category,
        "n": len(records),
        **table_summary([r.table_row() for r in records]),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    header = ["data source", "category", "n", *TABLE_COLUMNS]
    cells = [
        [row["data_source"], row["category"], str(row["n"])] + [f"{row[c]:.3f}" for c in TABLE_COLUMNS] for row in rows
    ]
    return markdown_table(header, cells) + "\n"


def write_results(run_dir: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Path]:
    return write_result_files(
        run_dir, {"meta": meta, "rows": rows}, markdown(rows), COLUMNS, ([row[c] for c in COLUMNS] for row in rows)
    )


def tabulate(
    run_dir: Path, records: list[GenerationRecord], meta: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Path], str]:
    """The run's `Tabulate` (``eval.core.loop``): the rows, the result files, the rows in markdown."""
    rows = table(records)
    return rows, write_results(run_dir, rows, meta), markdown(rows)
