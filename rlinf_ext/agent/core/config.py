"""`agentloop` settings: the schema's own section class (defaults live only in ``config/schema.py``), and the
checks the loop runs on it."""

from __future__ import annotations

from rlinf_ext.config.schema import AgentLoopConfig
from rlinf_ext.tools.formatting import OBSERVATION_FORMATS

__all__ = ["AgentLoopConfig", "check_agent_config"]


def check_agent_config(cfg: AgentLoopConfig) -> None:
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
