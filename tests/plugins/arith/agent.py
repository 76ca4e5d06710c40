"""A toy third agent, living outside ``rlinf_ext/``: arithmetic questions answered with the calculator tool
(``tests/plugins/calculator``) and no search. Chosen from a YAML by import path:
``agentloop.agent: tests.plugins.arith.agent:SPEC``.

It brings its own reward, its own config section (mounted at ``agentloop.arith``) and its registry entry, and reuses
the rest: the text tool-calling loop and rollout of Search-R1 (which read the chosen agent's section), the jsonl
prompt reader, the tiny model."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from rlinf_ext.agent.searchr1.config import SearchR1Config
from rlinf_ext.config.schema import fld
from rlinf_ext.protocol.agents import AgentSpec
from rlinf_ext.rewards import golden_list

CALCULATOR = "tests.plugins.calculator.tool:Calculator"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass
class ArithConfig(SearchR1Config):
    tools: list[str] = fld([CALCULATOR], "The arithmetic agent's tools: the calculator only.")


@dataclass
class ArithReward:
    score: float
    em: float
    answer: str | None


def as_number(text: str) -> float | None:
    try:
        return float(text.strip().replace(",", ""))
    except ValueError:
        return None


def arith_reward(response: str, golden_answers: Any, cfg: Any = None, num_searches: int = 0, **_: Any) -> ArithReward:
    """1 when the last ``<answer>`` is a number within 1e-6 of a gold one, else 0."""
    answers = _ANSWER.findall(response)
    answer = answers[-1].strip() if answers else None
    value = as_number(answer) if answer is not None else None
    golds = [as_number(g) for g in golden_list(golden_answers)]
    right = value is not None and any(g is not None and math.isclose(value, g, abs_tol=1e-6) for g in golds)
    scale = float(getattr(cfg, "reward_scale", 1.0)) if cfg is not None else 1.0
    return ArithReward(score=scale * float(right), em=float(right), answer=answer)


SPEC = AgentSpec(
    name="arith", title="Arithmetic QA", stops=("</answer>",), vision=False, reward_scorings=("em",),
    rollout="rlinf_ext.agent.searchr1.rollout:SearchR1Rollout",
    dataset="rlinf_ext.data.prompts:build_prompt_datasets",
    reward="tests.plugins.arith.agent:arith_reward",
    config="tests.plugins.arith.agent:ArithConfig",
)
