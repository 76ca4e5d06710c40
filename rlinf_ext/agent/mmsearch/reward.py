"""The MMSearch-R1 reward (pure functions): answer correctness, per-turn format, search penalty.

Inputs are the model's own turn texts (no observations) and the gold answers (ground truth + candidates).
- Correctness: the last `<answer>` of the *last* turn, Search-R1-normalised, matches a gold (EM or SubEM).
- Format (1 or 0), by the number of turns; each turn is judged on its own, anchored at both ends:
    1 turn : a direct answer            `<reason>…</reason>…<answer>…</answer>`
    2 turns: an image search or a text search, then a direct answer
    3 turns: an image search, then a text search, then a direct answer (the only 3-turn order)
  A direct answer has one reason and one answer block and no search call; an image search ends with
  `<search><img></search>` (once) and has no answer or text search; a text search ends with one
  `<text_search>…</text_search>` and has no answer or image search. More turns score 0.
- Search penalty: a correct answer reached after searching is multiplied by (1 - p) (`reward.search_penalty`),
  once, or once per search with `use_search_count_penalty`; with `search_penalty_warmup_steps` the penalty ramps
  linearly from -p (searching is rewarded) at step 0 to +p at the end of the warm-up.
- Final: `((1 - format_penalty) * score + format_penalty * format_score) * reward_scale`.
The shared terms come from the `reward` section, MMSearch-R1's own from `agentloop.mmsearch.reward` (`shaping`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from rlinf_ext.agent.mmsearch.config import RewardShapingConfig
from rlinf_ext.agent.mmsearch.protocol import IMAGE_CALL, clean_turn
from rlinf_ext.config.schema import RewardConfig
from rlinf_ext.rewards.qa_metrics import em_score, golden_list, subem_score

_DIRECT_ANSWER = re.compile(r"^<reason>.*</reason>.*<answer>.*</answer>$", re.DOTALL)
_IMAGE_SEARCH = re.compile(r"^<reason>.*</reason>.*<search><img></search>$", re.DOTALL)
_TEXT_SEARCH = re.compile(r"^<reason>.*</reason>.*<text_search>.*</text_search>$", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
SCORINGS = ("em", "subem")


def _one_reason(turn: str) -> bool:
    return turn.count("<reason>") == 1 and turn.count("</reason>") == 1


def is_direct_answer(turn: str) -> bool:
    return (
        bool(_DIRECT_ANSWER.match(turn))
        and _one_reason(turn)
        and turn.count("<answer>") == 1
        and turn.count("</answer>") == 1
        and IMAGE_CALL not in turn
        and "<text_search>" not in turn
        and "</text_search>" not in turn
    )


def is_image_search(turn: str) -> bool:
    return (
        bool(_IMAGE_SEARCH.match(turn))
        and _one_reason(turn)
        and turn.count(IMAGE_CALL) == 1
        and "<answer>" not in turn
        and "</answer>" not in turn
        and "<text_search>" not in turn
        and "</text_search>" not in turn
    )


def is_text_search(turn: str) -> bool:
    return (
        bool(_TEXT_SEARCH.match(turn))
        and _one_reason(turn)
        and turn.count("<text_search>") == 1
        and turn.count("</text_search>") == 1
        and "<answer>" not in turn
        and "</answer>" not in turn
        and IMAGE_CALL not in turn
    )


def format_score(turns: Sequence[str]) -> float:
    t = [clean_turn(x) for x in turns]
    if len(t) == 1:
        ok = is_direct_answer(t[0])
    elif len(t) == 2:
        ok = (is_image_search(t[0]) or is_text_search(t[0])) and is_direct_answer(t[1])
    elif len(t) == 3:
        ok = is_image_search(t[0]) and is_text_search(t[1]) and is_direct_answer(t[2])
    else:
        ok = False
    return 1.0 if ok else 0.0


def search_counts(turns: Sequence[str]) -> tuple[int, int]:
    """(image searches, text searches) asked for: turns containing the image call / a closed text search."""
    image = sum(1 for x in turns if IMAGE_CALL in x)
    text = sum(1 for x in turns if "<text_search>" in x and "</text_search>" in x)
    return image, text


def final_answer(turns: Sequence[str]) -> str | None:
    """The last `<answer>` of the last turn, stripped (None without one)."""
    if not turns:
        return None
    found = _ANSWER.findall(clean_turn(turns[-1]))
    return found[-1].strip() if found else None


def penalty_at(step: int, penalty: float, warmup_steps: int) -> float:
    """The search penalty in force at `step`: linear from -penalty to +penalty over the warm-up."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return penalty
    return -penalty + 2.0 * penalty * max(step, 0) / warmup_steps


@dataclass
class RewardResult:
    score: float
    answer: str | None
    correct: bool
    em: float
    subem: float
    format_score: float
    image_searches: int
    text_searches: int
    penalty: float  # the search penalty applied (0 when none)


def mmsearch_score(
    turns: Sequence[str], golden_answers: Any, cfg: Any, step: int = 0, shaping: RewardShapingConfig | None = None
) -> RewardResult:
    """Score one trajectory's turns (see the module docstring); `cfg` is the `reward` section, `shaping` the
    agent's `agentloop.mmsearch.reward` (None: its defaults)."""
    shaping = shaping if shaping is not None else RewardShapingConfig()
    if cfg.scoring not in SCORINGS:
        raise ValueError(f"reward.scoring must be one of {SCORINGS} for the MMSearch-R1 reward, got {cfg.scoring!r}")
    if not turns:
        raise ValueError("mmsearch reward needs at least one turn")
    golds = golden_list(golden_answers)
    answer = final_answer(turns)
    em = em_score(answer, golds) if answer is not None else 0.0
    subem = subem_score(answer, golds) if answer is not None else 0.0
    correct = (em if cfg.scoring == "em" else subem) > 0
    fmt = format_score(turns)
    n_image, n_text = search_counts(turns)
    score, applied = float(correct), 0.0
    if correct and n_image + n_text > 0:
        applied = penalty_at(step, float(cfg.search_penalty), int(shaping.search_penalty_warmup_steps))
        times = n_image + n_text if shaping.use_search_count_penalty else 1
        score *= (1.0 - applied) ** times
    fp = float(shaping.format_penalty)
    total = ((1.0 - fp) * score + fp * fmt) * float(cfg.reward_scale)
    return RewardResult(total, answer, correct, em, subem, fmt, n_image, n_text, applied)


def mmsearch_reward(
    response: str,
    golden_answers: Any,
    cfg: Any = None,
    num_searches: int = 0,
    *,
    turns: Sequence[str] | None = None,
    step: int = 0,
    agent_cfg: Any = None,
) -> RewardResult:
    """MMSearch-R1's reward (``AgentSpec.reward``); the format rule needs the per-turn texts, its own terms the
    agent's section (``agent_cfg``: ``agentloop.mmsearch``; None: its defaults)."""
    if turns is None:
        raise ValueError(
            "the MMSearch-R1 reward judges each turn on its own: call it with turns=[...] (the MMSearch "
            "agent loop does); a single response string is not enough"
        )
    if cfg is None:
        cfg = RewardConfig()
    shaping = None if agent_cfg is None else agent_cfg.reward
    return mmsearch_score(turns, golden_answers, cfg, step=step, shaping=shaping)
