"""Search-R1 agent loop: multi-turn rollout with engine stop strings, observation insertion, loss masks."""

from rlinf_ext.agent.config import AgentLoopConfig
from rlinf_ext.agent.loop import check_mask_invariant, run_group, run_trajectory, summarize_metrics
from rlinf_ext.agent.types import Trajectory, TurnRecord

__all__ = [
    "AgentLoopConfig",
    "Trajectory",
    "TurnRecord",
    "check_mask_invariant",
    "run_group",
    "run_trajectory",
    "summarize_metrics",
]
