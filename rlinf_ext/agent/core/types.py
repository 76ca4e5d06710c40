"""What the agent loop produces: one ``TurnRecord`` per generation turn, one ``Trajectory`` per rollout.

``Trajectory`` is what the loop hands to the reward and (through ``workers/agent_loop.py``) to the actor. The
engine side of the loop (``SamplingParams``, ``GenerationResult``, ``Generator``) is ``protocol/generation.py``.
Kept free of torch so that every package can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlinf_ext.agent.searchr1.protocol import ANSWER, EOS, INVALID, TOOL_DISABLED
from rlinf_ext.protocol.generation import FinishReason, WeightVersion

__all__ = ["ANSWER", "EOS", "INVALID", "TOOL_DISABLED", "Action", "Trajectory", "TurnRecord"]

Action = str  # what a turn did: the name of the tool it called (e.g. "search"), or ANSWER, EOS, INVALID, TOOL_DISABLED


@dataclass
class TurnRecord:
    """One generation turn: what the model saw, what it sampled, what the environment appended."""

    prompt_ids: list[int]
    response_ids: list[int]
    observation_ids: list[int]
    text: str
    action: Action
    finish_reason: FinishReason | None = None
    matched_stop: str | None = None
    tool: str | None = None  # the tool the turn called (its action), or whose call was disabled (tool_disabled)
    query: str | None = None  # what the turn put between the tool's tags
    tool_ok: bool | None = None  # the call succeeded (None: no call ran)
    logprobs: list[float] | None = None
    generated_tokens: int | None = None  # what the engine produced (> len(response_ids) only if it cut)
    # the weights that sampled the turn: one version, or one per response id (GenerationResult.weight_version)
    weight_version: WeightVersion = None


@dataclass
class Trajectory:
    """A whole multi-turn rollout of one prompt.

    Invariant: `response_mask[i] == 1` exactly for ids sampled by the model and `0` exactly for ids the
    environment inserted (observations, invalid-action messages). `len(response_ids) == len(response_mask)`.
    """

    uid: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    turns: list[TurnRecord]
    response_text: str
    answers: Any
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    rollout_logprobs: list[float] | None = None  # per response token; 0.0 on observation tokens
    rollout_versions: list[int] | None = None  # per response token: the weights that sampled it; -1 on observations
    end_reason: str = ""  # answer | eos | max_turns | response_budget | no_answer_after_final_turn

    @property
    def generated_text(self) -> str:
        """Only the model's own text, turn by turn (what the reward reads)."""
        return "".join(turn.text for turn in self.turns)
