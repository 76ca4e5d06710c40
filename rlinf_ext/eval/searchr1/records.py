"""One evaluated Search-R1 question as saved in ``generations.jsonl`` (one JSON object per line), and how it is
made from the agent loop's trajectory (scored with the training reward)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rlinf_ext.agent.core.types import Trajectory
from rlinf_ext.config.schema import RewardConfig
from rlinf_ext.eval.core.records import EvalRecord
from rlinf_ext.eval.searchr1.dataset import EvalItem
from rlinf_ext.rewards.format import DEFAULT_TOOL_TAGS
from rlinf_ext.rewards.searchr1 import searchr1_reward
from rlinf_ext.tools.search import TextSearch

SCORE_NAMES: tuple[str, ...] = ("em", "subem", "f1")
Decode = Callable[[list[int]], str]


@dataclass
class TurnLog:
    """One model turn: what it generated, what the tool answered (None when no tool ran)."""

    output: str
    observation: str | None = None
    action: str | None = None  # a tool's name ("search") | "answer" | "eos" | "invalid" | "tool_disabled" | None


@dataclass
class GenerationRecord(EvalRecord):
    TURN = TurnLog
    REQUIRED = ("benchmark", "item_id", "question", "prompt", "golden_answers")

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


def record_from_trajectory(
    item: EvalItem,
    traj: Trajectory,
    decode: Decode,
    reward_cfg: RewardConfig | None = None,
    tool_tags: Sequence[str] | None = None,
) -> GenerationRecord:
    """Everything a reader needs about one question: turns with their observations, answer, scores (the format
    score accepts ``tool_tags``; None = Search-R1's)."""
    turns = [
        TurnLog(
            output=t.text,
            observation=decode(list(t.observation_ids)) if t.observation_ids else None,
            action=t.action,
        )
        for t in traj.turns
    ]
    searches = [t for t in traj.turns if t.action == TextSearch.name]
    num_searches = len(searches)
    result = searchr1_reward(
        traj.generated_text,
        item.golden_answers,
        reward_cfg,
        num_searches=num_searches,
        tool_tags=DEFAULT_TOOL_TAGS if tool_tags is None else tuple(tool_tags),
    )
    return GenerationRecord(
        **_question_fields(item),
        turns=turns,
        response=traj.response_text,
        final_answer=result.answer,
        scores={"em": result.em, "subem": result.subem, "f1": result.f1, "reward": result.score},
        num_turns=len(traj.turns),
        num_searches=num_searches,
        search_failures=sum(1 for t in searches if t.tool_ok is False),
        response_length=len(traj.response_ids),
    )


def error_record(item: EvalItem, exc: BaseException) -> GenerationRecord:
    return GenerationRecord(**_question_fields(item), error=f"{type(exc).__name__}: {exc}")


def _question_fields(item: EvalItem) -> dict:
    """The fields every record of a question carries, rolled out or not."""
    return dict(
        benchmark=item.benchmark,
        item_id=item.item_id,
        question=item.question,
        prompt=item.prompt,
        golden_answers=list(item.golden_answers),
    )
