"""Reward functions by name, for `reward.reward_type` in the YAML.

A reward function is `fn(response: str, golden_answers, cfg, num_searches: int = 0, **kw) -> result with .score`;
`mmsearch` also needs `turns=[turn texts]` (its format rule judges each turn).
"""

from __future__ import annotations

from collections.abc import Callable

from rlinf_ext.rewards.mmsearch import mmsearch_reward
from rlinf_ext.rewards.searchr1 import RewardResult, searchr1_reward

RewardFn = Callable[..., RewardResult]

_REGISTRY: dict[str, RewardFn] = {}


def register_reward(name: str, fn: RewardFn) -> None:
    if name in _REGISTRY and _REGISTRY[name] is not fn:
        raise ValueError(f"reward type {name!r} is already registered")
    _REGISTRY[name] = fn


def get_reward_fn(name: str) -> RewardFn:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown reward.reward_type {name!r}; registered: {sorted(_REGISTRY)}"
        ) from None


def reward_names() -> list[str]:
    return sorted(_REGISTRY)


register_reward("searchr1", searchr1_reward)
register_reward("mmsearch", mmsearch_reward)
