"""What the preprocessing tests share: the example prompt config and reading the jsonl files they write."""

from __future__ import annotations

import json
from pathlib import Path

EXAMPLE_YAML = Path(__file__).resolve().parents[2] / "examples" / "searchr1" / "prompt.yaml"


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]
