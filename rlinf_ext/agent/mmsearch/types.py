"""What the MMSearch-R1 loop takes (one FVQA question) and hands on (a trajectory with its images)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlinf_ext.agent.core.types import Trajectory, TurnRecord
from rlinf_ext.protocol.images import ImageRef

Action = Literal["image_search", "text_search", "answer", "eos", "invalid", "search_limit"]
TOOL_IMAGE, TOOL_TEXT = "image", "text"


@dataclass(frozen=True)
class Task:
    """One question: the question text comes from the data row (never recovered from decoded ids)."""

    data_id: str
    question: str
    images: tuple[ImageRef, ...]
    answers: tuple[str, ...]  # ground truth first, then candidates
    category: str = "search_required"
    data_source: str = "fvqa"

    @classmethod
    def from_row(cls, row: Any) -> "Task":
        """From an `rlinf_ext.data.fvqa.FVQARow`."""
        return cls(row.data_id, row.question, tuple(row.images), tuple(row.golds), row.category, row.data_source)


@dataclass
class VLTurnRecord(TurnRecord):
    tool: str | None = None  # image | text, when a search ran
    titles: list[str] = field(default_factory=list)  # page titles shown by a search
    observation_images: list[ImageRef] = field(default_factory=list)
    banned_dropped: int = 0  # banned ids the engine returned anyway (dropped from the kept ids)


@dataclass
class VLTrajectory(Trajectory):
    images: list[ImageRef] = field(default_factory=list)  # in order of appearance in prompt + response ids
    data_id: str = ""
    category: str = ""
    data_source: str = ""
    question: str = ""
    reward_details: Any = None  # the reward's own result (rewards.mmsearch.RewardResult)
