"""`agentloop` settings as a dataclass (the typed experiment schema has the same names and help)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlinf_ext.tools.formatting import OBSERVATION_FORMATS


@dataclass
class AgentLoopConfig:
    group_name: str = "AgentLoopGroup"
    agent: str = "searchr1"
    max_turns: int = 4  # generation turns that may search; a forced final turn may follow
    response_length_total: int = 4096  # generated + observation tokens of one trajectory
    force_final_answer: bool = True  # Search-R1: one more turn with search disabled after max_turns
    max_obs_length: int = 500  # tokens per observation, tags included
    observation_format: str = "searchr1"  # searchr1: Doc i(Title: T) text | rlinf: [Doc k](url):
    print_outputs: bool = False


def check_agent_config(cfg: Any) -> None:
    if int(cfg.max_turns) < 0:
        raise ValueError(f"agentloop.max_turns must be >= 0, got {cfg.max_turns}")
    if int(cfg.response_length_total) < 1:
        raise ValueError(f"agentloop.response_length_total must be >= 1, got {cfg.response_length_total}")
    if int(cfg.max_obs_length) < 1:
        raise ValueError(f"agentloop.max_obs_length must be >= 1, got {cfg.max_obs_length}")
    if cfg.observation_format not in OBSERVATION_FORMATS:
        raise ValueError(
            f"agentloop.observation_format must be one of {OBSERVATION_FORMATS}, got {cfg.observation_format!r}"
        )
    if int(cfg.max_turns) == 0 and not cfg.force_final_answer:
        raise ValueError("agentloop.max_turns=0 with force_final_answer=false allows no generation at all")
