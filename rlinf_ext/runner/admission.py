"""Admission by group (``runner.admission: group``): a step trains the first ``data.rollout_batch_size`` groups to
finish among the batches in flight, within the staleness bound k.

Every group is trained exactly once by its deadline (dispatch version + k). Taking the first finishers could let a
slow group pass its deadline, so ``admit`` keeps every later step feasible: for each deadline d, the groups due by d
that it leaves must fit in ``(d - step) x size``; it waits for the groups that forces (k = 0: the whole batch, i.e.
batch admission). At most ``runner.in_flight_batches`` (default k + 1) batches are untrained, so deadlines always fit;
at the default, once full, each step must train the batch due; each batch below k + 1 adds a step of slack.
``GroupStream`` reads finished groups off the shared Rollout sub-queue (``protocol/channels.py:STREAM``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlinf_ext.workers.returns import FinishedGroup


@dataclass(frozen=True)
class Waiting:
    """A dispatched group no step has trained yet."""

    uid: str
    version: int  # the engines' weight version when its rollout started
    arrival: int | None  # its rank among the finished groups (None: still rolling out)


def admit(waiting: Sequence[Waiting], step: int, size: int, max_staleness: int) -> list[str] | None:
    """The uids step ``step`` trains (``size`` finished groups, in the order they finished), or None while it must
    wait for more: see the module docstring. Raises when a group is already past its deadline or the deadlines
    cannot all be met (more than ``(d - step + 1) x size`` groups due by some d: the dispatch broke its cap)."""
    deadline = {w.uid: w.version + max_staleness for w in waiting}
    late = sorted(uid for uid, d in deadline.items() if d < step)
    if late:
        raise RuntimeError(
            f"step {step}: group(s) {late[:4]} passed their staleness bound (runner.max_staleness="
            f"{max_staleness}) untrained"
        )
    finished = sorted((w for w in waiting if w.arrival is not None), key=lambda w: w.arrival)
    chosen: list[str] = []
    for d in sorted(set(deadline.values())):
        due = [uid for uid, dl in deadline.items() if dl <= d]
        owed = len(due) - (d - step) * size  # what the steps after this one up to d cannot take
        if owed > size:
            raise RuntimeError(
                f"step {step}: {len(due)} groups are due by step {d}, more than {d - step + 1} steps "
                f"of {size} can train"
            )
        short = owed - sum(deadline[uid] <= d for uid in chosen)
        if short > 0:
            ready = [w.uid for w in finished if deadline[w.uid] <= d and w.uid not in chosen]
            if len(ready) < short:
                return None
            chosen += ready[:short]
    for w in finished:
        if len(chosen) >= size:
            break
        if w.uid not in chosen:
            chosen.append(w.uid)
    if len(chosen) < size:
        return None
    rank = {w.uid: w.arrival for w in finished}
    return sorted(chosen, key=rank.__getitem__)


class GroupStream:
    """The groups in flight under group admission: which are waiting (and at which version), which finished, and
    the step's pick."""

    def __init__(self, size: int, max_staleness: int):
        self.size, self.max_staleness = size, max_staleness
        self.versions: dict[str, int] = {}  # uid -> dispatch version, for every untrained group (dispatch order)
        self.finished: dict[str, FinishedGroup] = {}  # uid -> its group, in the order they finished
        self._arrivals = 0
        self._rank: dict[str, int] = {}

    def dispatched(self, uids: Sequence[str], version: int) -> None:
        for uid in uids:
            self.versions[uid] = version

    def untrained(self) -> list[str]:
        return list(self.versions)

    def _arrived(self, group: FinishedGroup) -> None:
        uid = group.result.uid
        if uid not in self.versions:
            raise RuntimeError(f"the Rollout stream returned group {uid!r}, which no batch in flight holds")
        self.finished[uid] = group
        self._rank[uid] = self._arrivals
        self._arrivals += 1

    def take(self, step: int, read: Callable[[], FinishedGroup]) -> list[tuple[FinishedGroup, int]]:
        """Read finished groups (``read``: the next one off the stream, blocking) until ``admit`` picks step
        ``step``'s; returns them with their dispatch versions, and forgets them."""
        while True:
            waiting = [Waiting(uid, v, self._rank.get(uid)) for uid, v in self.versions.items()]
            picked = admit(waiting, step, self.size, self.max_staleness)
            if picked is not None:
                break
            self._arrived(read())
        out = [(self.finished.pop(uid), self.versions.pop(uid)) for uid in picked]
        for uid in picked:
            del self._rank[uid]
        return out

    def clear(self) -> None:
        self.versions.clear()
        self.finished.clear()
        self._rank.clear()
