"""``generations.jsonl``: appended one question at a time (flushed), read back to resume a run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlinf_ext.eval.core.records import EvalRecord

GENERATIONS_FILE = "generations.jsonl"


def read_generations(path: str | Path, record_cls: type[EvalRecord]) -> list[EvalRecord]:
    """Records in file order, the last one winning per (benchmark, item_id); `record_cls` (the agent's record,
    an `EvalRecord`) reads each line.

    A run killed mid-write leaves a partial last line; it is ignored (that question is simply redone).
    A corrupt line anywhere else is an error, since silently dropping it would change the results.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    latest: dict[tuple[str, str], EvalRecord] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):
                break  # torn write of an interrupted run
            raise ValueError(f"{path}:{lineno} is not valid JSON ({exc}); fix or delete that line") from exc
        rec = record_cls.from_json(row)
        latest.pop(rec.key, None)  # re-insert so the order follows the latest write
        latest[rec.key] = rec
    return list(latest.values())


def completed_keys(records: list[EvalRecord]) -> set[tuple[str, str]]:
    """Questions a rerun can skip: those finished without an error (errored ones are retried)."""
    return {r.key for r in records if r.error is None}


class GenerationsWriter:
    """Appends records to generations.jsonl, flushing each so an interrupted run loses at most one line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_torn_tail()
        self._fh = self.path.open("a", encoding="utf-8")

    def _drop_torn_tail(self) -> None:
        # A partial last line (no newline) would glue onto the next record; cut it before appending.
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with self.path.open("r+b") as fh:
                fh.truncate(cut)

    def write(self, record: EvalRecord) -> None:
        self._fh.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> GenerationsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
