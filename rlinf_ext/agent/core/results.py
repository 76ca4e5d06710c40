"""A prompt group's trajectories as the ``AgentRolloutResult`` the trainer consumes, and as plain records
(``on_step`` and the rollout dumps). Shared by every agent; an agent's rollout adds its own fields on top."""

from __future__ import annotations

from typing import Any

import torch

from rlinf_ext.agent.core.types import Trajectory
from rlinf_ext.protocol.payloads import AgentRolloutResult, pad_rows

ENDED_TURNS = ("answer", "eos")  # end reasons of a trajectory that finished on its own


def canonical_order(trajectories: list) -> list:
    """Sort a group by content: with per-request seeds the *set* is reproducible, this makes the order too."""
    return sorted(trajectories, key=lambda t: (t.response_ids, t.response_text))


def behaviour_logprobs(trajectories: list[Trajectory]) -> torch.Tensor | None:
    """The engine's log-probs of a group as ``pad_rows`` ``[n, max len]``; None unless every trajectory has them."""
    if any(t.rollout_logprobs is None for t in trajectories):
        return None
    return pad_rows([torch.tensor(t.rollout_logprobs, dtype=torch.float32) for t in trajectories])


def token_versions(trajectories: list[Trajectory]) -> list[list[int]]:
    """Each trajectory's per-token weight versions; empty unless every trajectory has them."""
    if any(t.rollout_versions is None for t in trajectories):
        return []
    return [list(t.rollout_versions) for t in trajectories]


def result_from_group(trajectories: list[Trajectory], prompt_text: str | None = None) -> AgentRolloutResult:
    """A group of trajectories (same prompt, same uid) -> one ``AgentRolloutResult``."""
    if not trajectories:
        raise ValueError("result_from_group needs at least one trajectory.")
    n = len(trajectories)
    return AgentRolloutResult(
        num_sequence=n,
        group_size=n,
        prompt_lengths=[len(t.prompt_ids) for t in trajectories],
        prompt_ids=[list(t.prompt_ids) for t in trajectories],
        response_lengths=[len(t.response_ids) for t in trajectories],
        response_ids=[list(t.response_ids) for t in trajectories],
        response_mask=[list(t.response_mask) for t in trajectories],
        is_end=[t.end_reason in ENDED_TURNS for t in trajectories],
        prompt_texts=[prompt_text or ""] * n,
        response_texts=[t.response_text for t in trajectories],
        answers=[t.answers for t in trajectories],
        uid=trajectories[0].uid,
        generated_texts=[t.generated_text for t in trajectories],
        num_searches=[int(t.metrics.get("searches", 0)) for t in trajectories],
        end_reasons=[t.end_reason for t in trajectories],
        trajectory_metrics=[dict(t.metrics) for t in trajectories],
        rollout_logprobs=behaviour_logprobs(trajectories),
        versions=token_versions(trajectories),
    )


def trajectory_records(result: AgentRolloutResult) -> list[dict[str, Any]]:
    """Plain dicts (JSON-friendly) of a result's trajectories, for ``on_step`` and the rollout dumps."""
    rewards = (
        result.rewards.tolist()
        if torch.is_tensor(result.rewards)
        else list(result.rewards or [None] * result.num_sequence)
    )
    return [
        {
            "uid": result.uid,
            "index": i,
            "prompt_text": (result.prompt_texts or [""] * result.num_sequence)[i],
            "response_text": result.response_texts[i],
            "prompt_ids": result.prompt_ids[i],
            "response_ids": result.response_ids[i],
            "response_mask": result.response_mask[i],
            "answers": result.answers[i],
            "reward": rewards[i],
            "end_reason": result.end_reasons[i],
            "metrics": result.trajectory_metrics[i],
            "versions": result.versions[i] if result.versions else None,  # per response token; -1 on observations
        }
        for i in range(result.num_sequence)
    ]
