"""Reward step: scores each trajectory with the rewards registry (``reward.reward_type``).

RLinf's ``RewardWorker`` is not importable without torchvision/vision models; this worker keeps its method
(``compute_rewards(input_channel, output_channel)``) and payload (``RolloutResult.rewards``) and scores the
model's own text (observations excluded) against the gold answers. The runner passes the step being trained
(``step``: 0 for the first), which the MMSearch-R1 reward needs for ``reward.search_penalty_warmup_steps``.
"""

from __future__ import annotations

import torch
from rlinf.scheduler import Worker

from rlinf_ext.agent.mmsearch.metrics import mm_summary_by_category
from rlinf_ext.config.schema import ExperimentConfig, RewardConfig
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.payloads import SearchRolloutResult
from rlinf_ext.rewards.registry import get_reward_fn


def score_result_details(result: SearchRolloutResult, reward_cfg: RewardConfig, step: int = 0):
    """``(rewards, em, reward results)``; MMSearch-R1 results pass each trajectory's turn texts (``turns=``) and the
    training step (``step=``: where the search penalty's warm-up stands)."""
    fn = get_reward_fn(str(reward_cfg.reward_type))
    texts = result.generated_texts or result.response_texts
    rewards, em, details = [], [], []
    for i in range(result.num_sequence):
        extra = {"turns": result.turn_texts[i], "step": int(step)} if result.turn_texts else {}
        res = fn(texts[i], result.answers[i], reward_cfg,
                 num_searches=result.num_searches[i] if result.num_searches else 0, **extra)
        rewards.append(float(res.score))
        em.append(float(res.em))
        details.append(res)
    return rewards, em, details


def mm_rows(result: SearchRolloutResult, details: list) -> list[dict]:
    """Per-trajectory rows of ``agent.mmsearch.metrics.mm_summary`` (category, correctness, searches that ran)."""
    rows = []
    for i, res in enumerate(details):
        m = result.trajectory_metrics[i]
        rows.append({"category": result.categories[i], "correct": float(res.correct), "reward": float(res.score),
                     **{k: float(m.get(k, 0.0)) for k in ("image_searches", "text_searches", "image_search_failures",
                                                           "text_search_failures")}})
    return rows


class RewardWorker(Worker):
    def __init__(self, cfg: ExperimentConfig):
        super().__init__()
        self.cfg = cfg

    def init_worker(self) -> None:
        with self.worker_timer():
            get_reward_fn(str(self.cfg.reward.reward_type))  # unknown names fail at start, not mid-run

    def compute_rewards(self, input_channel, output_channel, num_results: int, step: int) -> dict:
        """Score ``num_results`` groups of training step ``step`` (0 = the first); returns ``{"metrics": ...,
        "rewards": {uid: [..]}}``."""
        with self.worker_timer():
            all_rewards, all_em, by_uid, rows = [], [], {}, []
            for _ in range(num_results):
                result: SearchRolloutResult = input_channel.get()
                rewards, em, details = score_result_details(result, self.cfg.reward, step)
                if result.categories:
                    rows += mm_rows(result, details)
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
                **mm_summary_by_category(rows, prefix=mk.ROLLOUT_PREFIX),  # MMSearch-R1: per FVQA category
            }
            return {"metrics": metrics, "rewards": by_uid}
