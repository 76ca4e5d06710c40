"""The MMSearch-R1 results table: one row per (data source, category), one per data source, one overall."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlinf_ext.agent.mmsearch.metrics import TABLE_COLUMNS, mm_summary
from rlinf_ext.eval.mm_records import MMGenerationRecord

ALL = "all"
RESULTS_JSON, RESULTS_MD, RESULTS_CSV = "results.json", "results.md", "results.csv"


def mm_table(records: Sequence[MMGenerationRecord]) -> list[dict[str, Any]]:
    """Rows `{data_source, category, n, <TABLE_COLUMNS>}`; erroring questions count with score 0."""
    groups: dict[tuple[str, str], list[MMGenerationRecord]] = {}
    for r in records:
        for key in ((r.data_source, r.category), (r.data_source, ALL)):
            groups.setdefault(key, []).append(r)
    rows = [_row(src, cat, recs) for (src, cat), recs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] == ALL, kv[0][1]))]
    if records:
        rows.append(_row(ALL, ALL, list(records)))
    return rows


def _row(source: str, category: str, records: list[MMGenerationRecord]) -> dict[str, Any]:
    return {"data_source": source, "category": category, "n": len(records), **mm_summary([r.table_row() for r in records])}


def markdown(rows: list[dict[str, Any]]) -> str:
    header = ["data source", "category", "n", *TABLE_COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["data_source"], row["category"], str(row["n"])] + [f"{row[c]:.3f}" for c in TABLE_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_mm_results(run_dir: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Path]:
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: run_dir / name for name in (RESULTS_JSON, RESULTS_MD, RESULTS_CSV)}
    paths[RESULTS_JSON].write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    paths[RESULTS_MD].write_text(markdown(rows), encoding="utf-8")
    with paths[RESULTS_CSV].open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["data_source", "category", "n", *TABLE_COLUMNS])
        writer.writeheader()
        writer.writerows(rows)
    return paths
