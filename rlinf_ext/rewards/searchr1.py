"""The Search-R1 reward: a score from the final answer, optionally format-aware, with the peers' penalties.

`reward.scoring` picks the base score:
- `em` / `subem` / `f1`: the metric of the last `<answer>` in the response;
- `format`: Search-R1 v0.3's format-aware EM: correct+well-formed 1.0, correct+malformed 0.8,
  wrong (or no answer)+well-formed 0.2, wrong+malformed 0.1, no answer+malformed 0.0.
Then: more than `answer_tag_limit` answer tags divides a positive score by 4 (RLinf), a correct answer
reached with at least one search is multiplied by (1 - `search_penalty`) (MMSearch-R1 option, 0 = off),
and everything is multiplied by `reward_scale`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlinf_ext.config.schema import RewardConfig  # the `reward` section of the experiment YAML
from rlinf_ext.rewards.format import DEFAULT_TOOL_TAGS, is_well_formed
from rlinf_ext.rewards.qa_metrics import (
    count_answer_tags,
    em_score,
    extract_answer,
    f1_score,
    golden_list,
    subem_score,
)

SCORINGS = ("em", "subem", "f1", "format")
TAG_SPAM_FACTOR = 0.25  # RLinf: score / 4 when the answer tag is spammed


@dataclass
class FormatScores:
    """Search-R1 v0.3 format-aware values."""

    correct_well_formed: float = 1.0
    correct_malformed: float = 0.8
    wrong_well_formed: float = 0.2
    wrong_malformed: float = 0.1


@dataclass
class RewardResult:
    score: float
    answer: str | None
    em: float
    subem: float
    f1: float
    well_formed: bool
    answer_tags: int


def searchr1_reward(
    response: str,
    golden_answers: Any,
    cfg: RewardConfig | None = None,
    num_searches: int = 0,
    *,
    tool_tags: Sequence[str] = DEFAULT_TOOL_TAGS,
) -> RewardResult:
    """Score one response (the model's text, with inserted observations allowed) against the gold answers;
    ``tool_tags``: the tags of the agent's tools (``Tool.tag_name()``), which the format score accepts."""
    cfg = cfg if cfg is not None else RewardConfig()
    if cfg.scoring not in SCORINGS:
        raise ValueError(f"reward.scoring must be one of {SCORINGS}, got {cfg.scoring!r}")
    golds = golden_list(golden_answers)
    answer = extract_answer(response)
    em = em_score(answer, golds) if answer is not None else 0.0
    subem = subem_score(answer, golds) if answer is not None else 0.0
    f1 = f1_score(answer, golds) if answer is not None else 0.0
    well_formed = is_well_formed(response, tool_tags)
    tags = count_answer_tags(response)

    if cfg.scoring == "format":
        score = _format_aware(answer is not None, em > 0, well_formed, FormatScores())
    else:
        score = {"em": em, "subem": subem, "f1": f1}[cfg.scoring]
    correct = em > 0 if cfg.scoring in ("em", "format") else score > 0
    if score > 0 and tags > cfg.answer_tag_limit:
        score *= TAG_SPAM_FACTOR
    if correct and num_searches > 0 and cfg.search_penalty:
        score *= 1.0 - cfg.search_penalty
    return RewardResult(
        score=score * cfg.reward_scale,
        answer=answer,
        em=em,
        subem=subem,
        f1=f1,
        well_formed=well_formed,
        answer_tags=tags,
    )


def _format_aware(has_answer: bool, correct: bool, well_formed: bool, values: FormatScores) -> float:
    if correct:
        return values.correct_well_formed if well_formed else values.correct_malformed
    if well_formed:
        return values.wrong_well_formed
    return values.wrong_malformed if has_answer else 0.0
