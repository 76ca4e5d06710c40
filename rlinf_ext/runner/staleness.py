"""Metrics of a step whose batch was dispatched ahead of training (``runner.max_staleness = k``): how stale the
trained groups and tokens are, and how much of the step the actor and the rollout spent idle. Pure functions.

Versions count completed training steps (``global_step``): the engine samples batch b on the weights it held when
b was dispatched (the *head* version, the same for every group of the batch) and on later ones as syncs land between
turns (or within one, on a vLLM request preempted across a sync); the trajectories carry one version per response
token, -1 on observation tokens (``OBSERVATION_VERSION``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence

from rlinf_ext.agent.core.response import OBSERVATION_VERSION
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.training.staleness_bound import oldest_token_staleness


def head_staleness_metrics(trained_version: int, dispatch_versions: Sequence[int]) -> dict[str, float]:
    """``async/staleness_head_{max,mean}`` over the step's groups: ``trained_version`` (the actor's version that
    trains them, = global_step before the update) minus each group's version at dispatch."""
    if not dispatch_versions:
        return {}
    stale = [trained_version - v for v in dispatch_versions]
    return {mk.STALENESS_HEAD_MAX: float(max(stale)), mk.STALENESS_HEAD_MEAN: sum(stale) / len(stale)}


def token_staleness_metrics(
    trained_version: int, versions: Iterable[Sequence[int] | None], max_staleness: int
) -> dict[str, float]:
    """The share of sampled tokens at each staleness 0..``max_staleness`` (``async/token_staleness_<j>``) and the
    share of trajectories sampled by more than one version (``async/trajectories_two_versions``) and the oldest
    token's staleness (``async/staleness_token_max``), from each
    trajectory's per-token versions. Trajectories without versions (an engine that reports none) are left out;
    none at all gives no metric. A token outside 0..k means the engines' versions do not count training steps:
    warned, and left out of the shares."""
    versions = list(versions)  # read twice: the shares, then the oldest token
    counts = [0] * (max_staleness + 1)
    outside, trajectories, mixed = 0, 0, 0
    for per_token in versions:
        sampled = [v for v in (per_token or ()) if v != OBSERVATION_VERSION]
        if not sampled:
            continue
        trajectories += 1
        mixed += len(set(sampled)) > 1
        for v in sampled:
            stale = trained_version - v
            if 0 <= stale <= max_staleness:
                counts[stale] += 1
            else:
                outside += 1
    if not trajectories:
        return {}
    if outside:
        warnings.warn(
            f"{outside} sampled token(s) have a staleness outside 0..{max_staleness} at version "
            f"{trained_version}: the rollout engines' weight versions do not count training steps.",
            RuntimeWarning,
            stacklevel=2,
        )
    total = max(sum(counts), 1)
    out = {mk.token_staleness(j): c / total for j, c in enumerate(counts)}
    out[mk.TRAJECTORIES_TWO_VERSIONS] = mixed / trajectories
    if (
        max_staleness > 0
    ):  # at k = 0 every token is the step's own version: the synchronous run's metrics stay as they are
        out[mk.STALENESS_TOKEN_MAX] = float(oldest_token_staleness(trained_version, versions))
    return out


def busy_seconds(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` covered by at least one of ``intervals`` (``(begin, finish)`` pairs)."""
    clipped = sorted((max(b, start), min(f, end)) for b, f in intervals if f > start and b < end)
    covered, reach = 0.0, start
    for b, f in clipped:
        if f > reach:
            covered += f - max(b, reach)
            reach = f
    return covered


def idle_ratios(step_seconds: float, wait_rollout: float, rollout_busy: float) -> dict[str, float]:
    """``time/actor_idle_ratio``: the share of the step the driver was blocked on the rollout of the batch it trains
    (the actor had no batch to train; at k = 0 it recomputes the log-probs of the groups that have arrived meanwhile:
    verl's trainer idle ratio); ``time/rollout_idle_ratio``: the share of the step in which no batch was being rolled
    out (the engines had nothing to sample: the weight sync, and training once every dispatched batch is done)."""
    step = max(step_seconds, 1e-9)
    return {
        mk.TIME_ACTOR_IDLE_RATIO: min(wait_rollout / step, 1.0),
        mk.TIME_ROLLOUT_IDLE_RATIO: max(0.0, 1.0 - rollout_busy / step),
    }
