"""The agent registry: given ``agentloop.agent``, the one place that names everything that agent brings.

An entry holds the agent's facts (the stop strings its loop acts on, the data reader, the reward, whether it
needs a vision-language model, which evaluation engines it runs on) and names its components by import path:
the rollout (the loop behind the agent-loop worker), the evaluation, the validation pass during training, the
trajectory metrics and records. The
components are imported only when asked for (``load``), so config validation reads the facts without importing
torch or the loops. Nothing outside this module compares ``agentloop.agent`` with an agent's name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rlinf_ext.agent.mmsearch.protocol import MM_STOPS
from rlinf_ext.agent.searchr1.protocol import SEARCHR1_STOPS

SEARCHR1 = "searchr1"
MMSEARCH = "mmsearch"


@dataclass(frozen=True)
class AgentSpec:
    name: str  # the value of agentloop.agent
    title: str
    stops: tuple[str, ...]  # the closing tags a turn must stop at for the loop to act
    data_type: str  # data.type: the dataset reader
    reward_type: str  # reward.reward_type
    reward_scorings: tuple[str, ...]  # reward.scoring values the reward accepts
    vision: bool  # a vision-language model, images in the context, the multimodal tiny world
    image_search: bool  # the image-search tool (tools.image_search) and the agentloop.mmsearch section
    eval_backends: tuple[str, ...]  # rollout.rollout_backend values `rlinf-ext eval` runs this agent on
    rollout: str  # "module:attr" of the rollout class the agent-loop worker drives (agent/*/rollout.py)
    evaluation: str  # "module:attr" of its `run_evaluation(cfg, generator=None, **kwargs)`
    validation: str  # "module:attr" of its validation pass during training (`eval/core/validation.py`)

    def load(self, component: str) -> Any:
        """The object a component field names (``spec.load("rollout")``), imported now."""
        module, _, attr = getattr(self, component).partition(":")
        return getattr(importlib.import_module(module), attr)


AGENTS: dict[str, AgentSpec] = {
    SEARCHR1: AgentSpec(
        name=SEARCHR1, title="Search-R1", stops=SEARCHR1_STOPS, data_type="searchr1", reward_type="searchr1",
        reward_scorings=("em", "subem", "f1", "format"), vision=False, image_search=False,
        eval_backends=("vllm", "hf", "sglang"),
        rollout="rlinf_ext.agent.searchr1.rollout:SearchR1Rollout",
        evaluation="rlinf_ext.eval.searchr1.runner:run_evaluation",
        validation="rlinf_ext.eval.searchr1.validation:ValidationPass",
    ),
    MMSEARCH: AgentSpec(
        name=MMSEARCH, title="MMSearch-R1", stops=MM_STOPS, data_type="mmsearch", reward_type="mmsearch",
        reward_scorings=("em", "subem"), vision=True, image_search=True,
        eval_backends=("vllm", "hf"),  # vLLM: generation/vllm_vl.py
        rollout="rlinf_ext.agent.mmsearch.rollout:MMSearchRollout",
        evaluation="rlinf_ext.eval.mmsearch.runner:run_mm_evaluation",
        validation="rlinf_ext.eval.mmsearch.validation:MMValidationPass",
    ),
}


def agent_spec(cfg_or_name: Any) -> AgentSpec:
    """The entry of an agent name, or of an experiment config's ``agentloop.agent``."""
    name = cfg_or_name if isinstance(cfg_or_name, str) else cfg_or_name.agentloop.agent
    try:
        return AGENTS[name]
    except KeyError:
        raise ValueError(f"agentloop.agent={name!r} is not a registered agent; choose one of {sorted(AGENTS)}") from None
