"""Which finished groups a step admits under ``runner.admission: group`` (runner/admission.py:admit), by hand: the
first to finish, except the groups a later step could no longer take within the staleness bound."""

from __future__ import annotations

import pytest

from rlinf_ext.runner.admission import Waiting, admit


def groups(*specs: tuple[str, int, int | None]) -> list[Waiting]:
    return [Waiting(uid, version, arrival) for uid, version, arrival in specs]


def test_a_slow_group_of_the_oldest_batch_does_not_hold_the_step():
    # k = 1, two groups a step: batches 0 (a, b) and 1 (c, d) both dispatched at version 0, due by step 1
    waiting = groups(("a", 0, None), ("b", 0, 1), ("c", 0, 0), ("d", 0, None))
    assert admit(waiting, step=0, size=2, max_staleness=1) == ["c", "b"]  # the order they finished in


def test_the_last_chance_waits_for_the_groups_due_now():
    # step 1: a and d are due now (version 0 + k = 1); e and f (version 1) finished first but can wait
    waiting = groups(("a", 0, None), ("d", 0, 2), ("e", 1, 0), ("f", 1, 1))
    assert admit(waiting, step=1, size=2, max_staleness=1) is None
    waiting[0] = Waiting("a", 0, 3)
    assert admit(waiting, step=1, size=2, max_staleness=1) == ["d", "a"]


def test_a_step_takes_what_the_steps_before_a_deadline_cannot():
    # k = 2, one group a step, at step 1: x and y are due by step 2 (version 0), w by step 3. Steps 1 and 2 can
    # take two groups, so one of x, y must go now, even though w finished first
    waiting = groups(("x", 0, None), ("y", 0, 1), ("w", 1, 0))
    assert admit(waiting, step=1, size=1, max_staleness=2) == ["y"]
    assert admit(groups(("x", 0, None), ("y", 0, None), ("w", 1, 0)), step=1, size=1, max_staleness=2) is None


def test_k0_waits_for_the_whole_batch():
    waiting = groups(("a", 3, 0), ("b", 3, None))
    assert admit(waiting, step=3, size=2, max_staleness=0) is None
    assert admit(groups(("a", 3, 1), ("b", 3, 0)), step=3, size=2, max_staleness=0) == ["b", "a"]


def test_a_group_past_its_bound_or_too_many_due_is_an_error():
    with pytest.raises(RuntimeError, match=r"\['a'\] passed their staleness bound"):
        admit(groups(("a", 0, 0), ("b", 2, 1)), step=2, size=1, max_staleness=1)
    with pytest.raises(RuntimeError, match="3 groups are due by step 1"):
        admit(groups(("a", 0, 0), ("b", 0, 1), ("c", 0, 2)), step=0, size=1, max_staleness=1)
