"""Rewards for QA with search: pure metric functions and Search-R1's reward (each agent names its reward in
``protocol/agents.py``)."""

from rlinf_ext.rewards.format import is_well_formed
from rlinf_ext.rewards.qa_metrics import (
    count_answer_tags,
    exact_match,
    extract_answer,
    f1,
    golden_list,
    normalize_answer,
    sub_exact_match,
)
from rlinf_ext.rewards.searchr1 import RewardConfig, RewardResult, searchr1_reward

__all__ = [
    "RewardConfig",
    "RewardResult",
    "count_answer_tags",
    "exact_match",
    "extract_answer",
    "f1",
    "golden_list",
    "is_well_formed",
    "normalize_answer",
    "searchr1_reward",
    "sub_exact_match",
]
