"""Channel payloads: RLinf's ``RolloutRequest`` / ``RolloutResult`` plus the fields the agents need.

The subclasses keep every RLinf field (so RLinf helpers such as ``merge_result_list`` keep working) and add
the group id, search counts and per-trajectory agent metrics that the reward step and the logs read. The
agent-loop worker builds results from trajectories (``agent/core/results.py:result_from_group``). Importing RLinf's
``io_struct`` loads the ray package (nothing is started).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from rlinf.data.io_struct import RolloutRequest, RolloutResult


@dataclass
class AgentRolloutRequest(RolloutRequest):
    """One agent-loop rank's share of a rollout step (``n`` = group size)."""

    uids: list[str] = field(default_factory=list)
    seed: int = 0  # per-step sampling seed (same seed -> same trajectories)
    priority: int = 0  # the batch's dispatch index: engines serve the lowest first (the oldest batch, needed next)
    tasks: list = field(default_factory=list)  # an agent's own per-prompt task objects, when ids alone do not do


@dataclass(kw_only=True)
class AgentRolloutResult(RolloutResult):
    """One GRPO group: ``group_size`` trajectories of one prompt. RLinf's ``rollout_logprobs`` carries the engine's
    sampled log-probs (the behaviour policy) as one ``pad_rows`` tensor ``[n, max response length]`` (0.0 on
    observation tokens and padding), None unless every trajectory has them."""

    uid: str = ""
    generated_texts: list[str] = field(default_factory=list)  # the model's own text (what the reward reads)
    num_searches: list[int] = field(default_factory=list)
    end_reasons: list[str] = field(default_factory=list)
    trajectory_metrics: list[dict[str, float]] = field(default_factory=list)
    # filled by the agents that need them (empty otherwise): each trajectory's images in order of appearance
    # (protocol.images.ImageRef; a vision-language actor reads them), its turn texts (for a reward that judges each
    # turn) and its question's category (for reward metrics split by it)
    trajectory_images: list[list] = field(default_factory=list)
    turn_texts: list[list[str]] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    # per trajectory, per response token: the weight version that sampled it (-1 on observation tokens); empty
    # unless every trajectory has them (agent/core/response.py)
    versions: list[list[int]] = field(default_factory=list)


def pad_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """Ragged 1-D tensors -> ``[N, max_len]`` zero-padded (RLinf stores logprobs as one tensor per result)."""
    width = max([len(r) for r in rows] + [1])
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
