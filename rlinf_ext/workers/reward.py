"""Reward step: scores each trajectory with the agent's reward (``AgentSpec.reward``, ``protocol/agents.py``).

RLinf's ``RewardWorker`` is not importable without torchvision/vision models; this worker keeps its method
(``compute_rewards(input_channel, output_channel)``) and payload (``RolloutResult.rewards``) and scores the
model's own text (observations excluded) against the gold answers. The runner passes the step being trained
(``step``: 0 for the first), which the MMSearch-R1 reward needs for its search penalty's warm-up. A reward
that judges the agent's tool tags declares a ``tool_tags`` keyword (Search-R1's format score); it gets the configured
tools' tags, so a trajectory that calls a plug-in tool is scored as well-formed. A reward with its own settings
declares an ``agent_cfg`` keyword and gets the agent's section (``agentloop.<name>``).
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rlinf.scheduler import Worker

from rlinf_ext.config.schema import ExperimentConfig, RewardConfig
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.agents import agent_section, agent_spec, agent_tools
from rlinf_ext.protocol.payloads import AgentRolloutResult
from rlinf_ext.tools import registry as tool_registry
from rlinf_ext.workers.returns import RewardOutput


def takes_tool_tags(fn: Callable[..., Any]) -> bool:
    """Whether a reward function judges the tools' tags (declares a ``tool_tags`` keyword)."""
    return "tool_tags" in inspect.signature(fn).parameters


def takes_agent_cfg(fn: Callable[..., Any]) -> bool:
    """Whether a reward function reads the agent's own section (declares an ``agent_cfg`` keyword)."""
    return "agent_cfg" in inspect.signature(fn).parameters


def configured_tool_tags(cfg: Any) -> list[str]:
    """The tags of the tools the chosen agent calls (``protocol/agents.py:agent_tools``)."""
    return tool_registry.tool_tags(agent_tools(cfg))


def score_result_details(
    result: AgentRolloutResult,
    reward_cfg: RewardConfig,
    fn: Callable[..., Any],
    step: int = 0,
    tool_tags: Sequence[str] | None = None,
    agent_cfg: Any = None,
) -> tuple[list[float], list[float], list[Any]]:
    """``(rewards, em, reward results)`` of one group under reward ``fn``; results with turn texts pass each
    trajectory's turns (``turns=``) and the training step (``step=``: where a search penalty's warm-up stands);
    ``tool_tags`` (the configured tools' tags) and ``agent_cfg`` (the agent's section) reach a reward that declares
    them (None: the reward's default)."""
    texts = result.generated_texts or result.response_texts
    tags = {"tool_tags": tuple(tool_tags)} if tool_tags is not None and takes_tool_tags(fn) else {}
    if agent_cfg is not None and takes_agent_cfg(fn):
        tags["agent_cfg"] = agent_cfg
    rewards, em, details = [], [], []
    for i in range(result.num_sequence):
        extra = {**tags, **({"turns": result.turn_texts[i], "step": int(step)} if result.turn_texts else {})}
        res = fn(
            texts[i],
            result.answers[i],
            reward_cfg,
            num_searches=result.num_searches[i] if result.num_searches else 0,
            **extra,
        )
        rewards.append(float(res.score))
        em.append(float(res.em))
        details.append(res)
    return rewards, em, details


def mixed_group_share(groups: list[list[float]]) -> float:
    """Share of groups whose rewards are not all equal (pure): only those carry a GRPO advantage."""
    return sum(len(set(g)) > 1 for g in groups) / max(1, len(groups))


def shuffled_rewards(rewards: list[float], seed: int, step: int) -> list[float]:
    """``rewards`` permuted by a generator seeded with (seed, step): the shuffled-reward control's rewards (pure)."""
    permuted = list(rewards)
    random.Random(f"{seed}-{step}").shuffle(permuted)
    return permuted


class RewardWorker(Worker):
    def __init__(self, cfg: ExperimentConfig):
        super().__init__()
        self.cfg = cfg

    def init_worker(self) -> None:
        with self.worker_timer():
            spec = agent_spec(self.cfg)  # the components load at start, not mid-run
            self.reward_fn = spec.load("reward")
            self.reward_metrics = spec.load("reward_metrics") if spec.has("reward_metrics") else None
            self.tool_tags = configured_tool_tags(self.cfg)  # unknown tools fail at start too

    def compute_rewards(self, input_channel, output_channel, num_results: int, step: int) -> RewardOutput:
        """Score ``num_results`` groups of training step ``step`` (0 = the first); returns their true rewards
        (also under ``reward.shuffle_within_step``) and the reward/... metrics."""
        with self.worker_timer():
            all_rewards, all_em, by_uid, scored = [], [], {}, []
            shuffle = bool(self.cfg.reward.shuffle_within_step)
            for _ in range(num_results):
                result: AgentRolloutResult = input_channel.get()
                rewards, em, details = score_result_details(
                    result, self.cfg.reward, self.reward_fn, step, self.tool_tags, agent_section(self.cfg)
                )
                scored.append((result, details))
                result.rewards = torch.tensor(rewards, dtype=torch.float32)
                by_uid[result.uid] = rewards
                all_rewards += rewards
                all_em += em
                if not shuffle:  # streamed: the actor starts on the first groups
                    output_channel.put(result)
            if shuffle:  # the whole step first: the permutation spans every group
                permuted = shuffled_rewards(all_rewards, seed=int(self.cfg.data.seed), step=step)
                start = 0
                for result, _ in scored:
                    n = result.num_sequence
                    result.rewards = torch.tensor(permuted[start : start + n], dtype=torch.float32)
                    start += n
                    output_channel.put(result)
            n = max(len(all_rewards), 1)
            metrics = {
                mk.REWARD_MEAN: sum(all_rewards) / n,
                mk.REWARD_EM: sum(all_em) / n,
                mk.REWARD_MAX: max(all_rewards, default=0.0),
                mk.REWARD_MIN: min(all_rewards, default=0.0),
                mk.REWARD_MIXED_GROUPS: mixed_group_share(list(by_uid.values())),
                **(self.reward_metrics(scored) if self.reward_metrics else {}),
            }
            return RewardOutput(rewards=by_uid, metrics=metrics)
