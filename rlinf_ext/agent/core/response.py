"""What every agent loop accumulates over a trajectory's turns, written once.

INVARIANT (``check_mask_invariant``, run on every trajectory): ``response_ids`` is the concatenation over turns of
(sampled ids, observation ids) and ``response_mask`` is 1 on exactly the sampled ids and 0 on exactly the
observation ids. Log-probs follow the ids (0.0 on observations) while every turn brought its own; one turn without
them turns the whole trajectory's log-probs to None. Weight versions likewise (``OBSERVATION_VERSION`` on
observations): the version of the weights that sampled each id, the behaviour policy of an off-policy step. A turn
is usually sampled by one version; one a sync passed (vLLM resumed it on new weights after a preemption) brings one
per id, and its ids then carry two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_ext.agent.core.types import Trajectory
from rlinf_ext.protocol.generation import WeightVersion, token_versions

OBSERVATION_VERSION = -1  # the weight version of a token no model sampled


@dataclass
class ResponseBuffer:
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    versions: list[int] | None = field(default_factory=list)

    def add_sampled(self, ids: list[int], logprobs: list[float] | None, version: WeightVersion = None) -> None:
        """A turn's sampled ids (mask 1), their log-probs and the weight version(s) that sampled them."""
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        if self.logprobs is not None and logprobs is not None and len(logprobs) == len(ids):
            self.logprobs += list(logprobs)
        else:
            self.logprobs = None
        if self.versions is not None and version is not None:
            self.versions += token_versions(version, len(ids))
        else:
            self.versions = None

    def add_observation(self, ids: list[int]) -> None:
        """Environment ids (mask 0)."""
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(ids)
        if self.versions is not None:
            self.versions += [OBSERVATION_VERSION] * len(ids)

    def length_metrics(self) -> dict[str, float]:
        kept = sum(self.response_mask)
        return {
            "kept_tokens": float(kept),
            "observation_tokens": float(len(self.response_ids) - kept),
            "response_length": float(len(self.response_ids)),
        }


def check_mask_invariant(trajectory: Trajectory) -> None:
    """Raise AssertionError unless ids and mask are exactly the turns' sampled (1) and observation (0) ids, and the
    log-probs and versions (when kept) are one per id, the versions each turn's own (-1 on observations)."""
    expected_ids: list[int] = []
    expected_mask: list[int] = []
    for turn in trajectory.turns:
        expected_ids += turn.response_ids + turn.observation_ids
        expected_mask += [1] * len(turn.response_ids) + [0] * len(turn.observation_ids)
    if trajectory.response_ids != expected_ids or trajectory.response_mask != expected_mask:
        raise AssertionError(
            "loss-mask invariant broken: response ids/mask differ from the turns' sampled+observation ids"
        )
    n = len(expected_ids)
    if trajectory.rollout_logprobs is not None and len(trajectory.rollout_logprobs) != n:
        raise AssertionError(f"log-prob invariant broken: {len(trajectory.rollout_logprobs)} log-probs for {n} ids")
    if trajectory.rollout_versions is not None:
        expected = [
            v
            for turn in trajectory.turns
            for v in (token_versions(turn.weight_version, len(turn.response_ids)) or [])
            + [OBSERVATION_VERSION] * len(turn.observation_ids)
        ]
        if trajectory.rollout_versions != expected:
            raise AssertionError(
                "version invariant broken: token versions differ from the turns' versions "
                f"(-1 on observations): {len(trajectory.rollout_versions)} versions for {n} ids"
            )
