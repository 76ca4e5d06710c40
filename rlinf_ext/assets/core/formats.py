"""The on-disk forms the tiny assets are written in: jsonl and parquet (the rows themselves are each agent's)."""

from __future__ import annotations

import json
from pathlib import Path


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
