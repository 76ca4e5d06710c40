"""Benchmark questions from the eval config's `data.val_data_paths` (RLinf jsonl or Search-R1 parquet).

Each row becomes an `EvalItem` with its benchmark: the row's `data_source` (canonical when it names one of the
seven, as written otherwise), else the file name. So Search-R1's one merged `test.parquet` (or the `test.jsonl`
preprocessed from it) is grouped by `data_source` like one file per benchmark. An item also has a stable id for
resuming, the chat-formatted prompt and the gold answers. `data.data_size` keeps the first N questions of each
benchmark in each file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlinf_ext.eval.searchr1.benchmarks import benchmark_from_path, canonical_benchmark
from rlinf_ext.rewards import golden_list

_QUESTION_RE = re.compile(r"Question:\s*(.*?)\s*(?:<\|im_end\|>|$)", re.DOTALL)


@dataclass
class EvalItem:
    benchmark: str
    item_id: str
    question: str
    prompt: str  # the text the model is conditioned on (chat template applied)
    golden_answers: list[str]


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"benchmark file {path} does not exist; fix data.val_data_paths")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        rows = []
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}:{lineno} is not valid JSON: {exc}") from exc
        return rows
    raise ValueError(f"benchmark file {path}: unsupported extension '{path.suffix}' (use .jsonl or .parquet)")


def _answers(row: dict, answer_key: str, path: Path, idx: int) -> list[str]:
    if answer_key in row:
        return golden_list(row[answer_key])
    ground_truth = (row.get("reward_model") or {}).get("ground_truth")  # Search-R1 parquet layout
    if ground_truth is not None:
        return golden_list(ground_truth)
    raise ValueError(
        f"{path} row {idx}: no gold answers (no '{answer_key}' column and no reward_model.ground_truth); "
        f"set data.answer_key to the column that holds them"
    )


def _prompt(row: dict, prompt_key: str, apply_chat_template: bool, render_chat: Callable, path: Path, idx: int) -> str:
    if prompt_key not in row:
        raise ValueError(f"{path} row {idx}: no '{prompt_key}' column; set data.prompt_key (columns: {sorted(row)})")
    prompt = row[prompt_key]
    if isinstance(prompt, list):  # chat messages (Search-R1 parquet): always need the template
        return render_chat(prompt)
    if apply_chat_template:
        return render_chat([{"role": "user", "content": str(prompt)}])
    return str(prompt)


def question_of(row: dict, prompt_text: str) -> str:
    for key in ("question", "problem"):
        if isinstance(row.get(key), str):
            return row[key]
    match = _QUESTION_RE.search(prompt_text)
    return match.group(1).strip() if match else ""


def benchmark_of_row(row: dict, file_bench: str) -> str:
    """The row's `data_source` (canonical spelling when it is one of the seven), else the file's benchmark."""
    source = row.get("data_source")
    if isinstance(source, str) and source.strip():
        return canonical_benchmark(source) or source.strip()
    return file_bench


def load_eval_items(
    paths: list[str],
    render_chat: Callable[[list[dict]], str],
    prompt_key: str = "prompt",
    answer_key: str = "solutions",
    apply_chat_template: bool = False,
    data_size: int = -1,
) -> list[EvalItem]:
    """All questions of the benchmark files, in file order; `render_chat(messages) -> str` applies the template."""
    if not paths:
        raise ValueError(
            "data.val_data_paths is empty; list the test file(s) to evaluate: one merged file with a "
            "data_source column (Search-R1's test.parquet, or the test.jsonl preprocessed from it), or one "
            "file per benchmark"
        )
    items: list[EvalItem] = []
    seen: set[tuple[str, str]] = set()
    for file in paths:
        path = Path(file)
        file_bench = benchmark_from_path(path)
        taken: dict[str, int] = {}
        for idx, row in enumerate(read_rows(path)):
            bench = benchmark_of_row(row, file_bench)
            if 0 <= data_size <= taken.get(bench, 0):
                continue
            taken[bench] = taken.get(bench, 0) + 1
            prompt = _prompt(row, prompt_key, apply_chat_template, render_chat, path, idx)
            item_id = str(row["uid"]) if row.get("uid") is not None else f"{path.name}#{idx}"
            if (bench, item_id) in seen:
                raise ValueError(f"{path} row {idx}: duplicate question id '{item_id}' in benchmark '{bench}'")
            seen.add((bench, item_id))
            items.append(
                EvalItem(bench, item_id, question_of(row, prompt), prompt, _answers(row, answer_key, path, idx))
            )
    return items
