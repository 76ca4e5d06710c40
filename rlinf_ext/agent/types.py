"""Data types at the seams of the agent loop (docs/contracts.md §2 and §3).

`Generator` is what the agent loop needs from a rollout engine; `Trajectory` is what it hands to the reward
and the actor. Kept free of torch so that every package can import them cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "eos", "length"]


@dataclass
class SamplingParams:
    """Per-call sampling settings (names follow `algorithm.sampling_params`)."""

    max_new_tokens: int = 500
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) = off
    do_sample: bool = True
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = True
    repetition_penalty: float = 1.0

    @classmethod
    def from_config(cls, section: Any, **overrides: Any) -> "SamplingParams":
        """Build from an `algorithm.sampling_params`-like object (attribute access).

        Only names this dataclass knows are read; a missing attribute keeps the dataclass default so a
        partial section (a test's SimpleNamespace) works too.
        """
        values: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            if hasattr(section, name):
                value = getattr(section, name)
                if name == "stop":
                    value = list(value or [])
                values[name] = value
        values.update(overrides)
        return cls(**values)

    def with_updates(self, **changes: Any) -> "SamplingParams":
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["stop"] = list(self.stop)
        data.update(changes)
        return SamplingParams(**data)


@dataclass
class GenerationResult:
    """One engine call's outcome.

    `output_ids` are exactly the sampled ids: nothing after the stop string, EOS kept if sampled.
    `num_generated` is how many tokens the engine actually produced (defaults to len(output_ids));
    it differs only for engines that generate past a stop and cut afterwards (the benchmark's baseline).
    """

    output_ids: list[int]
    text: str
    finish_reason: FinishReason
    matched_stop: str | None = None
    logprobs: list[float] | None = None
    num_generated: int | None = None

    @property
    def generated_tokens(self) -> int:
        return len(self.output_ids) if self.num_generated is None else self.num_generated


@runtime_checkable
class Generator(Protocol):
    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams) -> GenerationResult: ...


Action = Literal["search", "answer", "eos", "invalid", "search_disabled", "truncated"]


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
    query: str | None = None
    search_ok: bool | None = None
    logprobs: list[float] | None = None
    generated_tokens: int | None = None  # what the engine produced (> len(response_ids) only if it cut)


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
    end_reason: str = ""  # answer | eos | max_turns | response_budget | no_answer_after_final_turn

    @property
    def generated_text(self) -> str:
        """Only the model's own text, turn by turn (what the reward reads)."""
        return "".join(turn.text for turn in self.turns)
