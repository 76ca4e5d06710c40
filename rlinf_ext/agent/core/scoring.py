"""Score a Trajectory with the reward named by `reward.reward_type` (rlinf_ext.rewards registry)."""

from __future__ import annotations

from collections.abc import Callable

from rlinf_ext.agent.core.types import Trajectory
from rlinf_ext.config.schema import RewardConfig
from rlinf_ext.rewards import get_reward_fn


def trajectory_reward_fn(reward_cfg: RewardConfig) -> Callable[[Trajectory], float]:
    """`fn(trajectory) -> score` reading the response only (observations included for the format check;
    answers inside `<information>` are ignored by the extractor) and the trajectory's search count."""
    fn = get_reward_fn(reward_cfg.reward_type)

    def score(trajectory: Trajectory) -> float:
        searches = int(trajectory.metrics.get("searches", 0))
        return fn(trajectory.response_text, trajectory.answers, reward_cfg, num_searches=searches).score

    return score
