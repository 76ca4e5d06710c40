"""Reward step: scores each trajectory with the rewards registry (``reward.reward_type``).

RLinf's ``RewardWorker`` is not importable without torchvision/vision models; this worker keeps its method
(``compute_rewards(input_channel, output_channel)``) and payload (``RolloutResult.rewards``) and scores the
model's own text (observations excluded) against the gold answers.
"""

from __future__ import annotations

import torch
from rlinf.scheduler import Worker

from rlinf_ext.config.schema import ExperimentConfig, RewardConfig
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.payloads import SearchRolloutResult
from rlinf_ext.rewards.registry import get_reward_fn


def score_result(result: SearchRolloutResult, reward_cfg: RewardConfig) -> tuple[list[float], list[float]]:
    """``(rewards, em)`` of one group, pure (no worker state)."""
    fn = get_reward_fn(str(reward_cfg.reward_type))
    texts = result.generated_texts or result.response_texts
    rewards, em = [], []
    for i in range(result.num_sequence):
        res = fn(texts[i], result.answers[i], reward_cfg, num_searches=result.num_searches[i] if result.num_searches else 0)
        rewards.append(float(res.score))
        em.append(float(res.em))
    return rewards, em


class SearchR1RewardWorker(Worker):
    def __init__(self, cfg: ExperimentConfig):
        super().__init__()
        self.cfg = cfg

    def init_worker(self) -> None:
        with self.worker_timer():
            get_reward_fn(str(self.cfg.reward.reward_type))  # unknown names fail at start, not mid-run

    def compute_rewards(self, input_channel, output_channel, num_results: int) -> dict:
        """Score ``num_results`` groups; returns ``{"metrics": ..., "rewards": {uid: [..]}}``."""
        with self.worker_timer():
            all_rewards, all_em, by_uid = [], [], {}
            for _ in range(num_results):
                result: SearchRolloutResult = input_channel.get()
                rewards, em = score_result(result, self.cfg.reward)
                result.rewards = torch.tensor(rewards, dtype=torch.float32)
                by_uid[result.uid] = rewards
                all_rewards += rewards
                all_em += em
                output_channel.put(result)
            n = max(len(all_rewards), 1)
            metrics = {
                mk.REWARD_MEAN: sum(all_rewards) / n,
                mk.REWARD_EM: sum(all_em) / n,
                mk.REWARD_MAX: max(all_rewards, default=0.0),
                mk.REWARD_MIN: min(all_rewards, default=0.0),
            }
            return {"metrics": metrics, "rewards": by_uid}
