"""One evaluated question as saved in ``generations.jsonl`` (one JSON object per line): what every agent's record
shares.

An agent's record is a dataclass deriving from `EvalRecord`. Besides its own fields it declares the common ones:
``benchmark`` and ``item_id`` (together the resume key), ``question``, ``golden_answers``, ``turns`` (a list of its
``TURN`` dataclass), ``final_answer``, ``scores``, ``num_turns``, ``response_length`` and ``error`` (set when the
rollout raised: the question scores 0 and is retried on resume). The field order is the order of the JSON keys.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, ClassVar


class EvalRecord:
    """The generic part of a record: its resume key and its JSON line. Subclasses set ``TURN`` (the dataclass of
    one turn's log) and ``REQUIRED`` (the keys a line must have to be read back as this record)."""

    TURN: ClassVar[type]
    REQUIRED: ClassVar[tuple[str, ...]]

    benchmark: str
    item_id: str
    error: str | None

    @property
    def key(self) -> tuple[str, str]:
        return (self.benchmark, self.item_id)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]):
        row = dict(row)
        missing = [k for k in cls.REQUIRED if k not in row]
        if missing:
            raise ValueError(
                f"generation record lacks {missing}; was it written by this agent's evaluation ({cls.__name__})?"
            )
        row["turns"] = [cls.TURN(**t) for t in row.get("turns", [])]
        return cls(**row)
