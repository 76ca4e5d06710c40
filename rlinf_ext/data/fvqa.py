"""FVQA-format parquet (MMSearch-R1's data layout), read and written by one module.

Columns: `prompt` (chat messages; the user message is the raw question, an `<image>` placeholder allowed),
`images` (list of `{bytes, path}`), `reward_model` (`{ground_truth, candidate_answers (JSON list), style}`),
`data_id` (the image-search cache key), `category` (`search_required` | `search_free`), `data_source`,
`image_urls` (null in the released files). Images are canonicalised here, once, as they enter the project
(`rlinf_ext.protocol.images`). The gold answers are the ground truth followed by the candidates.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from rlinf_ext.protocol.images import ImageError, ImageRef, canonicalize

IMAGE_PLACEHOLDER = "<image>"
CATEGORIES = ("search_required", "search_free")
REQUIRED_COLUMNS = ("prompt", "images", "reward_model", "data_id")


class FVQAError(ValueError):
    pass


@dataclass
class FVQARow:
    data_id: str
    question: str
    images: list[ImageRef]
    ground_truth: str
    candidate_answers: list[str] = field(default_factory=list)
    category: str = "search_required"
    data_source: str = "fvqa"

    @property
    def golds(self) -> list[str]:
        """Ground truth first, then the candidates not already listed."""
        out: list[str] = []
        for answer in [self.ground_truth, *self.candidate_answers]:
            if answer and answer not in out:
                out.append(answer)
        return out


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def question_from_prompt(prompt: Any) -> str:
    """The last user message's text, `<image>` placeholders removed."""
    prompt = _plain(prompt)
    if isinstance(prompt, str):
        text = prompt
    else:
        users = [m for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise FVQAError("prompt has no user message; FVQA rows hold [{'role': 'user', 'content': question}]")
        content = _plain(users[-1].get("content"))
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        text = str(content or "")
    question = text.replace(IMAGE_PLACEHOLDER, " ").strip()
    if not question:
        raise FVQAError("the user message holds no question text")
    return question


def candidates_of(value: Any) -> list[str]:
    """`candidate_answers` as stored: a JSON list in a string, a list, or null."""
    value = _plain(value)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return [value]
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    raise FVQAError(f"candidate_answers must be a JSON list or a list, got {type(value).__name__}")


def _image_bytes(item: Any, where: str) -> bytes:
    item = _plain(item)
    if isinstance(item, dict):
        data = item.get("bytes")
        if data is None and item.get("path"):
            path = Path(item["path"])
            if not path.is_file():
                raise FVQAError(f"{where}: image path {path} does not exist (and no bytes are stored)")
            data = path.read_bytes()
    else:
        data = item
    if not isinstance(data, (bytes, bytearray)):
        raise FVQAError(f"{where}: an image entry must hold bytes or a path, got {type(data).__name__}")
    return bytes(data)


def parse_row(raw: dict, min_pixels: int, max_pixels: int, where: str = "row") -> FVQARow:
    missing = [c for c in REQUIRED_COLUMNS if c not in raw]
    if missing:
        raise FVQAError(f"{where}: missing FVQA column(s) {missing}; expected {list(REQUIRED_COLUMNS)}")
    reward = _plain(raw["reward_model"]) or {}
    if not isinstance(reward, dict) or reward.get("ground_truth") in (None, ""):
        raise FVQAError(f"{where}: reward_model.ground_truth is missing")
    truth = _plain(reward["ground_truth"])
    truth_list = truth if isinstance(truth, list) else [truth]
    images = [_image_bytes(item, where) for item in _plain(raw["images"]) or []]
    try:
        refs = [canonicalize(data, min_pixels, max_pixels, what=f"{where} image {k}") for k, data in enumerate(images)]
    except ImageError as exc:
        raise FVQAError(str(exc)) from None
    return FVQARow(
        data_id=str(raw["data_id"]),
        question=question_from_prompt(raw["prompt"]),
        images=refs,
        ground_truth=str(truth_list[0]),
        candidate_answers=[str(t) for t in truth_list[1:]] + candidates_of(reward.get("candidate_answers")),
        category=str(raw.get("category") or "search_required"),
        data_source=str(raw.get("data_source") or "fvqa"),
    )


def is_fvqa_table(columns: Iterable[str]) -> bool:
    return set(REQUIRED_COLUMNS) <= set(columns)


def read_fvqa(path: str | Path, min_pixels: int, max_pixels: int, limit: int | None = None) -> list[FVQARow]:
    """Rows of an FVQA parquet, images canonicalised; unique `data_id`s are required (they key the cache)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FVQAError(f"FVQA file {path} does not exist")
    table = pq.read_table(path)
    if not is_fvqa_table(table.column_names):
        raise FVQAError(f"{path}: not an FVQA parquet (columns {table.column_names}; need {list(REQUIRED_COLUMNS)})")
    rows: list[FVQARow] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(table.to_pylist()):
        if limit is not None and len(rows) >= limit:
            break
        row = parse_row(raw, min_pixels, max_pixels, where=f"{path} row {n}")
        if row.data_id in seen:
            raise FVQAError(
                f"{path}: data_id {row.data_id!r} appears in rows {seen[row.data_id]} and {n}; "
                "data_id keys the image-search cache and must be unique"
            )
        seen[row.data_id] = n
        rows.append(row)
    return rows


def _schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
            ("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))),
            (
                "reward_model",
                pa.struct([("ground_truth", pa.string()), ("candidate_answers", pa.string()), ("style", pa.string())]),
            ),
            ("data_id", pa.string()),
            ("category", pa.string()),
            ("image_urls", pa.list_(pa.string())),
        ]
    )


def to_record(row: FVQARow) -> dict:
    return {
        "data_source": row.data_source,
        "prompt": [{"content": f"{IMAGE_PLACEHOLDER}{row.question}", "role": "user"}],
        "images": [{"bytes": ref.data, "path": None} for ref in row.images],
        "reward_model": {
            "ground_truth": row.ground_truth,
            "candidate_answers": json.dumps(row.candidate_answers),
            "style": "rule",
        },
        "data_id": row.data_id,
        "category": row.category,
        "image_urls": None,
    }


def write_fvqa(rows: list[FVQARow], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist([to_record(r) for r in rows], schema=_schema()), tmp, compression="zstd")
    tmp.replace(path)
    return path


@dataclass
class FVQAReport:
    read: int = 0
    written: int = 0
    images: int = 0
    by_source: Counter = field(default_factory=Counter)
    by_category: Counter = field(default_factory=Counter)
    grids: Counter = field(default_factory=Counter)  # "WxH" of canonical images

    def summary(self, output: Path) -> str:
        fmt = lambda c: ", ".join(f"{k}: {v}" for k, v in sorted(c.items()))  # noqa: E731
        return (
            f"read {self.read} FVQA rows, wrote {self.written} to {output} ({self.images} images, canonical "
            f"sizes {fmt(self.grids)}); by source: {fmt(self.by_source)}; by category: {fmt(self.by_category)}"
        )


def preprocess_fvqa(inputs: list[Path], output: Path, min_pixels: int, max_pixels: int) -> FVQAReport:
    """Read FVQA parquets, canonicalise their images, write one FVQA parquet (data_ids unique across inputs)."""
    report, rows, seen = FVQAReport(), [], {}
    for path in inputs:
        for row in read_fvqa(path, min_pixels, max_pixels):
            report.read += 1
            if row.data_id in seen:
                raise FVQAError(
                    f"data_id {row.data_id!r} appears in {seen[row.data_id]} and {path}; "
                    "data_id keys the image-search cache and must be unique"
                )
            seen[row.data_id] = path
            rows.append(row)
            report.by_source[row.data_source] += 1
            report.by_category[row.category] += 1
            report.images += len(row.images)
            report.grids.update(f"{ref.width}x{ref.height}" for ref in row.images)
    write_fvqa(rows, output)
    report.written = len(rows)
    return report
