"""One evaluated MMSearch-R1 question as saved in ``generations.jsonl`` (one JSON object per line), and how it is
made from the MMSearch-R1 loop's trajectory."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from rlinf_ext.agent.mmsearch.types import Task, VLTrajectory
from rlinf_ext.eval.core.records import EvalRecord

_PAD_RUN = re.compile(r"(?:<\|image_pad\|>)+")


@dataclass
class TurnLog:
    action: str  # image_search | text_search | answer | eos | invalid | search_limit
    output: str  # the model's own text of this turn
    tool: str | None = None  # image | text, when a search ran
    query: str | None = None  # the text-search query
    titles: list[str] = field(default_factory=list)  # page titles the search showed
    image_sha1s: list[str] = field(default_factory=list)  # thumbnails shown (sha1 of their PNG bytes)
    search_ok: bool | None = None
    observation: str | None = None  # the observation text, image pad runs collapsed to one


@dataclass
class GenerationRecord(EvalRecord):
    TURN = TurnLog
    REQUIRED = ("benchmark", "item_id", "question", "data_source", "category")

    benchmark: str  # the data file's stem
    item_id: str  # the data_id (resume key together with benchmark)
    question: str
    data_source: str
    category: str
    golden_answers: list[str]
    image_sha1s: list[str] = field(default_factory=list)  # the question's images
    turns: list[TurnLog] = field(default_factory=list)
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

    def table_row(self) -> dict[str, float]:
        """The per-question numbers the results table averages (`agent.mmsearch.metrics.table_summary`)."""
        return {
            "correct": self.scores.get("correct", 0.0),
            "reward": self.scores.get("reward", 0.0),
            "image_searches": self.image_searches,
            "text_searches": self.text_searches,
            "image_search_failures": self.image_search_failures,
            "text_search_failures": self.text_search_failures,
        }


def record_of(benchmark: str, task: Task, traj: VLTrajectory, decode: Callable[[list[int]], str]) -> GenerationRecord:
    turns = [
        TurnLog(
            action=t.action,
            output=t.text,
            tool=t.tool,
            query=t.query,
            titles=list(t.titles),
            image_sha1s=[i.sha1 for i in t.observation_images],
            search_ok=t.tool_ok,
            observation=_PAD_RUN.sub("<|image_pad|>", decode(t.observation_ids)) if t.observation_ids else None,
        )
        for t in traj.turns
    ]
    r, m = traj.reward_details, traj.metrics
    return GenerationRecord(
        benchmark=benchmark,
        item_id=task.data_id,
        question=task.question,
        data_source=task.data_source,
        category=task.category,
        golden_answers=list(task.answers),
        image_sha1s=[i.sha1 for i in task.images],
        turns=turns,
        final_answer=r.answer,
        scores={"correct": float(r.correct), "em": r.em, "subem": r.subem, "format": r.format_score, "reward": r.score},
        image_searches=int(m["image_searches"]),
        text_searches=int(m["text_searches"]),
        image_search_failures=int(m["image_search_failures"]),
        text_search_failures=int(m["text_search_failures"]),
        missing_images=int(m["missing_images"]),
        num_turns=len(traj.turns),
        response_length=len(traj.response_ids),
        end_reason=traj.end_reason,
    )


def error_record(benchmark: str, task: Task, exc: BaseException) -> GenerationRecord:
    return GenerationRecord(
        benchmark=benchmark,
        item_id=task.data_id,
        question=task.question,
        data_source=task.data_source,
        category=task.category,
        golden_answers=list(task.answers),
        image_sha1s=[i.sha1 for i in task.images],
        error=f"{type(exc).__name__}: {exc}",
    )
