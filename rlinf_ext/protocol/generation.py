"""The generation contract at the seams: what the agent loop asks of an engine and what comes back.

- ``SamplingParams`` / ``GenerationResult`` / ``Generator``: the in-process contract (``generation/`` engines
  implement it; the agent loop, evaluation and validation call it).
- ``GenerateRequest`` / ``GenerateReply``: the same call as dicts on RLinf channels, between the agent-loop
  workers (``workers/agent_loop.py:ChannelGenerator``) and the rollout workers (``workers/rollout_hf.py``,
  ``workers/rollout_sglang.py``). ``STOP_SERVING`` as a request's ``channel_key`` ends a serving loop.

Kept free of torch so that every package can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

FinishReason = Literal["stop", "eos", "length"]
# the weights that sampled a call's ids: one version for all, one per id, or none (GenerationResult.weight_version)
WeightVersion = int | list[int] | None


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
    `weight_version` is the version of the weights that sampled the ids (the training steps behind them, 0 = the
    initial weights): one int when one version sampled them all, as a sync waits for the calls in flight; a list,
    one per id, when a sync passed the call (vLLM: a request preempted for KV space sits out the pause and resumes
    on the new weights); None from an engine that keeps no version (evaluation, tests). ``token_versions`` reads it.
    """

    output_ids: list[int]
    text: str
    finish_reason: FinishReason
    matched_stop: str | None = None
    logprobs: list[float] | None = None
    num_generated: int | None = None
    weight_version: WeightVersion = None

    @property
    def generated_tokens(self) -> int:
        return len(self.output_ids) if self.num_generated is None else self.num_generated


def token_versions(version: WeightVersion, num_ids: int) -> list[int] | None:
    """``GenerationResult.weight_version`` as one version per sampled id (None: the engine keeps none) (pure)."""
    if version is None:
        return None
    if isinstance(version, int):
        return [version] * num_ids
    if len(version) != num_ids:
        raise ValueError(
            f"{len(version)} weight versions for {num_ids} sampled ids: a per-token version list must "
            "follow the ids it labels (cut it with them)"
        )
    return [int(v) for v in version]


@runtime_checkable
class Generator(Protocol):
    """`images`: vision-language engines only; every image of the context, in order of appearance."""

    async def generate(
        self, prompt_ids: list[int], sampling_params: SamplingParams, images: list[Any] | None = None
    ) -> GenerationResult: ...


# --------------------------------------------------------------------------------------------- over channels
STOP_SERVING = "__stop_serving__"  # a request whose channel_key is this ends the rollout's serving loop
FINISH_REASONS: tuple[str, ...] = ("stop", "eos", "length")
WEIGHT_VERSION = "weight_version"  # the reply key of GenerationResult.weight_version


class GenerateRequest(TypedDict, total=False):
    """One generate call on the ``GenerateInput`` channel (RLinf's request dict plus ``seed``)."""

    channel_key: str  # the reply goes to the output channel under this key
    prompt_ids: list[int]
    sampling_params: dict[str, Any]  # SamplingParams fields; absent ones keep the rollout's config defaults, but
    # `stop` is the request's alone (sampling_params_from_request)
    seed: int  # per-request sampling seed (reproducible rollouts)
    priority: int  # the dispatch index of its batch: lower is served first (AgentRolloutRequest.priority)
    images: list[Any]  # vision-language engines: every image of the context in order (protocol.images.ImageRef)


class GenerateReply(TypedDict, total=False):
    """The rollout's answer to one ``GenerateRequest``; only ``error`` when generation failed."""

    output_ids: list[int]
    text: str
    finish_reason: str  # one of FINISH_REASONS
    matched_stop: str | None
    logprobs: list[float] | None
    num_generated: int
    weight_version: int | list[int] | None  # WEIGHT_VERSION: the weights that sampled it (GenerationResult's)
    error: str


def sampling_params_from_request(defaults: SamplingParams, overrides: dict | None) -> SamplingParams:
    """Config defaults overridden key by key by the request (RLinf's rule), except ``stop``: the request's alone
    (none when it names none). The agent loop sends its stop list with every turn, so one filled in from the
    config could only hide a request that lost it."""
    overrides = dict(overrides or {})
    unknown = set(overrides) - set(SamplingParams.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown sampling params in a generate request: {sorted(unknown)}")
    return defaults.with_updates(**{"stop": [], **overrides})


def reply_of(result: GenerationResult) -> GenerateReply:
    """A ``GenerationResult`` as the reply dict every rollout worker sends."""
    return {
        "output_ids": list(result.output_ids),
        "text": result.text,
        "finish_reason": result.finish_reason,
        "matched_stop": result.matched_stop,
        "logprobs": result.logprobs,
        "num_generated": result.generated_tokens,
        WEIGHT_VERSION: result.weight_version,
    }


def result_of(reply: GenerateReply) -> GenerationResult:
    """The reply dict back as a ``GenerationResult``; an ``error`` reply raises with the engine's message."""
    if "error" in reply:
        raise RuntimeError(f"rollout engine failed to generate: {reply['error']}")
    reason = reply["finish_reason"]
    return GenerationResult(
        output_ids=reply["output_ids"],
        text=reply.get("text") or "",
        finish_reason=reason if reason in FINISH_REASONS else "eos",
        matched_stop=reply.get("matched_stop"),
        logprobs=reply.get("logprobs"),
        num_generated=reply.get("num_generated"),
        weight_version=reply.get(WEIGHT_VERSION),
    )
