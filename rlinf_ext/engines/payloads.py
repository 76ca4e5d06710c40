"""Channel payloads: RLinf's ``RolloutRequest`` / ``RolloutResult`` plus the fields Search-R1 needs.

The subclasses keep every RLinf field (so RLinf helpers such as ``merge_result_list`` keep working) and add
the group id, search counts and per-trajectory agent metrics that the reward step and the logs read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from rlinf.data.io_struct import RolloutRequest, RolloutResult

from rlinf_ext.agent.types import Trajectory


@dataclass
class SearchRolloutRequest(RolloutRequest):
    """One agent-loop rank's share of a rollout step (``n`` = group size)."""

    uids: list[str] = field(default_factory=list)
    seed: int = 0  # per-step sampling seed (same seed -> same trajectories)


@dataclass(kw_only=True)
class SearchRolloutResult(RolloutResult):
    """One GRPO group: ``group_size`` trajectories of one prompt."""

    uid: str = ""
    generated_texts: list[str] = field(default_factory=list)  # the model's own text (what the reward reads)
    num_searches: list[int] = field(default_factory=list)
    end_reasons: list[str] = field(default_factory=list)
    trajectory_metrics: list[dict[str, float]] = field(default_factory=list)


def empty_request(n: int) -> SearchRolloutRequest:
    return SearchRolloutRequest(n=n, input_ids=[], image_data=[], answers=[], multi_modal_inputs=[], uids=[])


def result_from_group(trajectories: list[Trajectory], prompt_text: str | None = None) -> SearchRolloutResult:
    """A group of trajectories (same prompt, same uid) -> one ``SearchRolloutResult``."""
    if not trajectories:
        raise ValueError("result_from_group needs at least one trajectory.")
    n = len(trajectories)
    return SearchRolloutResult(
        num_sequence=n,
        group_size=n,
        prompt_lengths=[len(t.prompt_ids) for t in trajectories],
        prompt_ids=[list(t.prompt_ids) for t in trajectories],
        response_lengths=[len(t.response_ids) for t in trajectories],
        response_ids=[list(t.response_ids) for t in trajectories],
        response_mask=[list(t.response_mask) for t in trajectories],
        is_end=[t.end_reason in ("answer", "eos") for t in trajectories],
        prompt_texts=[prompt_text or ""] * n,
        response_texts=[t.response_text for t in trajectories],
        answers=[t.answers for t in trajectories],
        uid=trajectories[0].uid,
        generated_texts=[t.generated_text for t in trajectories],
        num_searches=[int(t.metrics.get("searches", 0)) for t in trajectories],
        end_reasons=[t.end_reason for t in trajectories],
        trajectory_metrics=[dict(t.metrics) for t in trajectories],
    )


def pad_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """Ragged 1-D tensors -> ``[N, max_len]`` zero-padded (RLinf stores logprobs as one tensor per result)."""
    width = max([len(r) for r in rows] + [1])
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def trajectory_records(result: SearchRolloutResult) -> list[dict[str, Any]]:
    """Plain dicts (JSON-friendly) of a result's trajectories, for ``on_step`` and the rollout dumps."""
    rewards = result.rewards.tolist() if torch.is_tensor(result.rewards) else list(result.rewards or [None] * result.num_sequence)
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
        }
        for i in range(result.num_sequence)
    ]
