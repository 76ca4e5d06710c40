"""Rewards for QA with search: pure metric functions and a registry by name (`reward.reward_type`)."""

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
from rlinf_ext.rewards.registry import get_reward_fn, register_reward, reward_names
from rlinf_ext.rewards.searchr1 import RewardConfig, RewardResult, searchr1_reward

__all__ = [
    "RewardConfig",
    "RewardResult",
    "count_answer_tags",
    "exact_match",
    "extract_answer",
    "f1",
    "get_reward_fn",
    "golden_list",
    "is_well_formed",
    "normalize_answer",
    "register_reward",
    "reward_names",
    "searchr1_reward",
    "sub_exact_match",
]
