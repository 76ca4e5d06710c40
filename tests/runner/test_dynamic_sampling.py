"""The pure part of dynamic sampling (runner/dynamic_sampling.py), hand-computed: the share unit, what a step trains
from its scored batches (the merged returns of several batches: tests/workers/test_returns.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner.dynamic_sampling import is_informative, select_groups, share_unit


def group(uid: str, *rewards: float):
    return SimpleNamespace(uid=uid, rewards=torch.tensor(rewards))


MIXED, ONES, ZEROS = (0.0, 1.0), (1.0, 1.0), (0.0, 0.0)


def test_informative_means_rewards_that_differ():
    assert is_informative([0.0, 1.0]) and is_informative([0.2, 0.2, 1.0])
    assert not is_informative([1.0, 1.0]) and not is_informative([0.0]) and not is_informative([])


@pytest.mark.parametrize(
    "dp,group_size,n_minibatches,unit",
    [(1, 5, 1, 1), (2, 5, 1, 2), (1, 2, 4, 2), (1, 4, 2, 1), (4, 2, 4, 4), (3, 2, 4, 6), (2, 3, 9, 6)],
)
def test_share_unit_is_the_fewest_groups_the_ranks_and_minibatches_split(dp, group_size, n_minibatches, unit):
    assert share_unit(dp, group_size, n_minibatches) == unit
    assert unit % dp == 0 and (unit * group_size) % n_minibatches == 0


def test_enough_kept_groups_train_the_first_in_generation_order_and_drop_the_surplus():
    batches = [
        [group("a", *ZEROS), group("b", *MIXED)],
        [group("c", *MIXED), group("d", *ONES)],
        [group("e", *MIXED), group("f", *MIXED)],
    ]
    sel = select_groups(batches, target=2, unit=1)
    assert [r.uid for r in sel.trained] == ["b", "c"]
    assert (sel.kept, sel.dropped, sel.padded, sel.surplus) == (2, 2, 0, 2)  # e, f: past the target
    sel3 = select_groups(batches[2:] + batches[:1], target=2, unit=1)
    assert [r.uid for r in sel3.trained] == ["e", "f"] and (sel3.kept, sel3.dropped, sel3.surplus) == (2, 1, 1)


def test_short_of_kept_groups_the_step_pads_to_a_whole_unit_with_dropped_groups():
    batches = [
        [group("a", *ZEROS), group("b", *MIXED), group("c", *ONES), group("d", *MIXED)],
        [group("e", *MIXED), group("f", *ZEROS), group("g", *ZEROS), group("h", *ONES)],
    ]
    sel = select_groups(batches, target=4, unit=2)  # 3 kept -> 4: one dropped group (the first, a)
    assert [r.uid for r in sel.trained] == ["b", "d", "e", "a"]
    assert (sel.kept, sel.dropped, sel.padded, sel.surplus) == (3, 5, 1, 0)
    assert sel.metrics(gen_batches=2) == {
        mk.DYNAMIC_KEPT_GROUPS: 3.0,
        mk.DYNAMIC_DROPPED_GROUPS: 5.0,
        mk.DYNAMIC_GEN_BATCHES: 2.0,
        mk.DYNAMIC_PADDED_GROUPS: 1.0,
    }
    assert [r.uid for r in select_groups(batches, target=4, unit=1).trained] == ["b", "d", "e"]
    nothing = select_groups([[group("a", *ZEROS), group("b", *ONES)]], target=2, unit=2)
    assert [r.uid for r in nothing.trained] == ["a", "b"] and (nothing.kept, nothing.padded) == (0, 2)


def test_a_target_that_is_no_whole_number_of_units_is_refused():
    with pytest.raises(ValueError, match="share units"):
        select_groups([[group("a", *MIXED)]], target=3, unit=2)
