"""One evaluated question as saved in ``generations.jsonl`` (one JSON object per line)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCORE_NAMES: tuple[str, ...] = ("em", "subem", "f1")


@dataclass
class TurnLog:
    """One model turn: what it generated, what the tool answered (None when no search ran)."""

    output: str
    observation: str | None = None
    action: str | None = None  # "search" | "answer" | "invalid" | None (as reported by the agent loop)


@dataclass
class GenerationRecord:
    benchmark: str
    item_id: str  # stable id of the question inside its benchmark (resume key together with benchmark)
    question: str
    prompt: str
    golden_answers: list[str]
    turns: list[TurnLog] = field(default_factory=list)
    response: str = ""
    final_answer: str | None = None
    scores: dict[str, float] = field(default_factory=dict)  # em, subem, f1 in [0, 1]
    num_turns: int = 0
    num_searches: int = 0
    search_failures: int = 0
    response_length: int = 0  # response tokens (generated + observation)
    error: str | None = None  # set when the rollout raised; the question scores 0 and is retried on resume

    @property
    def key(self) -> tuple[str, str]:
        return (self.benchmark, self.item_id)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> GenerationRecord:
        row = dict(row)
        row["turns"] = [TurnLog(**t) for t in row.get("turns", [])]
        missing = [k for k in ("benchmark", "item_id", "question", "prompt", "golden_answers") if k not in row]
        if missing:
            raise ValueError(f"generation record lacks {missing}; was it written by rlinf_ext.eval?")
        return cls(**row)
