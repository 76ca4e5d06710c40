"""Partial rollout's staleness bound (``runner.partial_rollout``): a turn may now be sampled by two weight versions,
so "no trained token is older than k versions" is checked on each trajectory's oldest sampled token, by the actor
before its update (``workers/actor.py:run_training``). Pure functions.

Versions count training steps; observation tokens (tool output) carry ``OBSERVATION_VERSION`` and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlinf_ext.agent.core.response import OBSERVATION_VERSION


class StalenessBoundError(RuntimeError):
    """A trajectory about to be trained holds a token sampled more than ``runner.max_staleness`` versions ago."""


def oldest_token_staleness(trained_version: int, versions: Iterable[Sequence[int] | None]) -> int | None:
    """The staleness of the oldest sampled token over the trajectories (``async/staleness_token_max``): the
    bound partial rollout keeps, since one turn may now span versions. None when no trajectory has versions."""
    oldest = [
        min(sampled)
        for per_token in versions
        if (sampled := [v for v in (per_token or ()) if v != OBSERVATION_VERSION])
    ]
    return trained_version - min(oldest) if oldest else None


def check_token_bound(
    trained_version: int, versions: Sequence[Sequence[int] | None], max_staleness: int, names: Sequence[str] = ()
) -> None:
    """Refuse a step that would train a token older than ``max_staleness`` versions (partial rollout's bound: on
    the oldest token of each trajectory, not on its head). Dropping the trajectory instead would bias the step
    towards the short ones, so the step stops, naming the trajectories: the dispatch that let them through is the
    bug (batches are dispatched at most k steps ahead, and every token is sampled after its batch's dispatch)."""
    late = [
        (names[i] if i < len(names) else f"#{i}", stale)
        for i, per_token in enumerate(versions)
        if (stale := oldest_token_staleness(trained_version, [per_token])) is not None and stale > max_staleness
    ]
    if late:
        shown = ", ".join(f"{name} ({stale} versions)" for name, stale in late[:4])
        raise StalenessBoundError(
            f"runner.partial_rollout: {len(late)} trajectory(ies) to be trained at version {trained_version} hold "
            f"tokens older than runner.max_staleness={max_staleness}: {shown}. The batches were dispatched further "
            "ahead than k, or the engines' weight versions do not count training steps; report it with the run's log."
        )
