"""A toy third agent, living outside ``rlinf_ext/``: arithmetic questions answered with the calculator tool
(``examples/plugins/calculator/tool.py``) and no search. Chosen from a YAML by import path:
``agentloop.agent: examples.plugins.arith.agent:SPEC``.

Its own: the reward, the config section (``agentloop.arith``) and the registry entry. Reused: Search-R1's text
tool-calling loop (it reads the chosen agent's section) and the jsonl prompt reader."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from rlinf_ext.agent.searchr1.config import SearchR1Config
from rlinf_ext.config.schema import fld
from rlinf_ext.protocol.agents import AgentSpec
from rlinf_ext.rewards import golden_list

CALCULATOR = "examples.plugins.calculator.tool:Calculator"
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
    name="arith",
    title="Arithmetic QA",
    stops=("</answer>",),
    vision=False,
    reward_scorings=("em",),
    rollout="rlinf_ext.agent.searchr1.rollout:SearchR1Rollout",
    dataset="rlinf_ext.data.prompts:build_prompt_datasets",
    reward="examples.plugins.arith.agent:arith_reward",
    config="examples.plugins.arith.agent:ArithConfig",
)
