"""One evaluated MMSearch-R1 question as saved in ``generations.jsonl`` (one JSON object per line)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class MMTurnLog:
    action: str  # image_search | text_search | answer | eos | invalid | search_limit
    output: str  # the model's own text of this turn
    tool: str | None = None  # image | text, when a search ran
    query: str | None = None  # the text-search query
    titles: list[str] = field(default_factory=list)  # page titles the search showed
    image_sha1s: list[str] = field(default_factory=list)  # thumbnails shown (sha1 of their PNG bytes)
    search_ok: bool | None = None
    observation: str | None = None  # the observation text, image pad runs collapsed to one


@dataclass
class MMGenerationRecord:
    benchmark: str  # the data file's stem
    item_id: str  # the data_id (resume key together with benchmark)
    question: str
    data_source: str
    category: str
    golden_answers: list[str]
    image_sha1s: list[str] = field(default_factory=list)  # the question's images
    turns: list[MMTurnLog] = field(default_factory=list)
    final_answer: str | None = None
    scores: dict[str, float] = field(default_factory=dict)  # correct, em, subem, format, reward
    image_searches: int = 0
    text_searches: int = 0
    image_search_failures: int = 0
    text_search_failures: int = 0
    missing_images: int = 0
    num_turns: int = 0
    response_length: int = 0  # response ids, observations and expanded image pads included
    end_reason: str = ""
    error: str | None = None  # set when the rollout raised; scores 0, retried on resume

    @property
    def key(self) -> tuple[str, str]:
        return (self.benchmark, self.item_id)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> "MMGenerationRecord":
        row = dict(row)
        missing = [k for k in ("benchmark", "item_id", "question", "data_source", "category") if k not in row]
        if missing:
            raise ValueError(f"MM generation record lacks {missing}; was it written by an mmsearch evaluation?")
        row["turns"] = [MMTurnLog(**t) for t in row.get("turns", [])]
        return cls(**row)

    def table_row(self) -> dict[str, float]:
        """The per-question numbers the results table averages (`agent.mmsearch.metrics.mm_summary`)."""
        return {"correct": self.scores.get("correct", 0.0), "reward": self.scores.get("reward", 0.0),
                "image_searches": self.image_searches, "text_searches": self.text_searches,
                "image_search_failures": self.image_search_failures, "text_search_failures": self.text_search_failures}
