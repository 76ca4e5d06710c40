"""The result files of an evaluation run directory: results.json, results.md and results.csv.

What goes into them is the agent's table (``eval/<agent>/results.py``); writing and reading them is shared.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RESULTS_CSV = "results.csv"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_result_files(
    run_dir: str | Path,
    payload: dict[str, Any],
    markdown: str,
    csv_header: Sequence[str],
    csv_rows: Iterable[Sequence[Any]],
) -> dict[str, Path]:
    """results.json (`payload`, whose "meta" holds the run's settings), results.md and results.csv; their paths
    by file name."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: run_dir / name for name in (RESULTS_JSON, RESULTS_MD, RESULTS_CSV)}
    paths[RESULTS_JSON].write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    with paths[RESULTS_CSV].open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(csv_header)
        writer.writerows(csv_rows)
    paths[RESULTS_MD].write_text(markdown, encoding="utf-8")
    return paths


def load_results(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / RESULTS_JSON
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: RUN_DIR must be an evaluation run directory, runner.output_dir/runner.experiment_name "
            "of the evaluation (its launcher prints it: '[launch] evaluation results: DIR'; the default "
            "runner.output_dir is <repo>/outputs/runs, so pass the training run's runner.output_dir to the evaluation "
            "too)"
        )
    return json.loads(path.read_text(encoding="utf-8"))
