"""QA rows in the two on-disk forms the project reads: Search-R1 parquet and RLinf jsonl."""

from __future__ import annotations

import json
from pathlib import Path

from rlinf_ext.assets.qa import Question

# Search-R1's `base` prompt (docs/searchr1-facts.md §1); the tags must stay exactly as written.
SEARCHR1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)


def searchr1_prompt(question: str) -> str:
    question = question.strip()
    if not question.endswith("?"):
        question += "?"
    return SEARCHR1_PROMPT.format(question=question)


def searchr1_row(q: Question, data_source: str, split: str, index: int) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": searchr1_prompt(q.question)}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": list(q.answers)}, "style": "rule"},
        "extra_info": {"split": split, "index": index},
    }


def rlinf_row(q: Question, data_source: str, uid: str, tokenizer) -> dict:
    """RLinf jsonl row; the prompt is already chat-formatted (RLinf's `apply_chat_template: False` form)."""
    messages = [{"role": "user", "content": searchr1_prompt(q.question)}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return {"prompt": prompt, "solutions": list(q.answers), "data_source": data_source, "uid": uid}


def write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    # no compression timestamps or dictionary surprises: the bytes must be identical for identical rows
    pq.write_table(pa.Table.from_pylist(rows), path, compression="zstd", store_schema=True)


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
