"""Dynamic sampling (DAPO's refill; ``algorithm.adv_type: grpo_dynamic``): the pure part of the step.

A group with all-equal rewards has zero GRPO advantage: it only costs compute and dilutes the token mean. The step
drops such groups and reads the next batches (from the data order, so the position counts them) until
``data.rollout_batch_size`` groups are kept, ``algorithm.max_num_gen_batches`` batches were generated or the data
ran out. ``select_groups``: enough kept: the first ``rollout_batch_size`` in generation order (the surplus dropped,
as verl's DAPO trainer does); fewer: all kept, padded with dropped groups to a whole ``share_unit`` (what the DP
ranks and ``algorithm.n_minibatches`` split evenly; none kept: one unit). verl raises there, ending a run on a hard
stretch of data; padding keeps the step and is logged (``dynamic/padded_groups``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlinf_ext.protocol import metric_keys as mk


def is_informative(rewards: Sequence[float]) -> bool:
    """A group whose rewards differ: the only kind with a non-zero GRPO advantage (``reward.mixed_group_share``'s
    test, exact equality: identical rewards come from the same arithmetic)."""
    return len(set(float(r) for r in rewards)) > 1


def share_unit(dp_size: int, group_size: int, n_minibatches: int) -> int:
    """The fewest groups a step can train: a multiple of the actor's data-parallel size (each rank takes whole
    groups, ``training/data_parallel.share_of``) whose trajectories split into ``n_minibatches`` equal parts."""
    per_minibatch = n_minibatches // math.gcd(n_minibatches, group_size)  # groups so that groups x size divides
    return math.lcm(dp_size, per_minibatch)


@dataclass(frozen=True)
class Selection:
    """The groups a dynamic step trains, and what was done to get them."""

    trained: list[Any]  # the results to train, kept groups first, then padding, each in generation order
    kept: int  # informative groups trained
    dropped: int  # all-equal groups generated this step (some may come back as padding)
    padded: int  # all-equal groups trained to complete the last share unit
    surplus: int  # informative groups generated beyond data.rollout_batch_size, discarded

    def metrics(self, gen_batches: int) -> dict[str, float]:
        return {
            mk.DYNAMIC_KEPT_GROUPS: float(self.kept),
            mk.DYNAMIC_DROPPED_GROUPS: float(self.dropped),
            mk.DYNAMIC_GEN_BATCHES: float(gen_batches),
            mk.DYNAMIC_PADDED_GROUPS: float(self.padded),
        }


def _rewards(result: Any) -> list[float]:
    """A scored result's rewards (the reward worker sets a tensor; the trained rewards, shuffled ones included)."""
    return result.rewards.tolist() if hasattr(result.rewards, "tolist") else list(result.rewards)


def kept_count(batches: Sequence[Sequence[Any]]) -> int:
    """Informative groups among the results (each with ``rewards``) of the batches generated so far."""
    return sum(is_informative(_rewards(r)) for batch in batches for r in batch)


def select_groups(batches: Sequence[Sequence[Any]], target: int, unit: int) -> Selection:
    """What a step trains from the scored results of its generated batches (``batches``: per batch, the results in
    dispatch order, each with ``rewards``): see the module docstring. ``target`` is ``data.rollout_batch_size``, a
    multiple of ``unit`` (the batch rule)."""
    if unit < 1 or target % unit:
        raise ValueError(f"data.rollout_batch_size={target} is not a whole number of share units ({unit} groups).")
    flat = [r for batch in batches for r in batch]
    mixed = [is_informative(_rewards(r)) for r in flat]
    kept = [r for r, m in zip(flat, mixed) if m]
    dropped = [r for r, m in zip(flat, mixed) if not m]
    if len(kept) >= target:
        return Selection(kept[:target], target, len(dropped), 0, len(kept) - target)
    size = max(unit, -(-len(kept) // unit) * unit)
    padding = dropped[: size - len(kept)]
    if len(kept) + len(padding) < size:  # only when a batch held fewer groups than one unit
        raise ValueError(f"{len(flat)} groups generated cannot fill one share unit of {unit} groups.")
    return Selection(kept + padding, len(kept), len(dropped), len(padding), 0)


class Ready:
    """A group call's stand-in whose values are known (the dynamic step waited for its calls already): the
    ``wait()``/``done()`` the trainer's later waits use."""

    def __init__(self, values: list):
        self.values = values

    def wait(self) -> list:
        return self.values

    def done(self) -> bool:
        return True
