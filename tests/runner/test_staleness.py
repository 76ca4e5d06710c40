"""The pure metrics of runner/staleness.py against hand-computed values."""

from __future__ import annotations

import pytest

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner.staleness import busy_seconds, head_staleness_metrics, idle_ratios, token_staleness_metrics
from rlinf_ext.training.staleness_bound import StalenessBoundError, check_token_bound, oldest_token_staleness


def test_head_staleness_is_the_trained_version_minus_the_dispatch_version():
    assert head_staleness_metrics(5, [3, 3, 4, 5]) == {
        mk.STALENESS_HEAD_MAX: 2.0,
        mk.STALENESS_HEAD_MEAN: 1.25,
    }  # 2, 2, 1, 0
    assert head_staleness_metrics(5, []) == {}


def test_token_staleness_shares_leave_out_observations():
    # trained at version 4, k = 2: sampled tokens at versions 4, 3, 3, 2 (staleness 0, 1, 1, 2) and 4, 4 (0, 0)
    versions = [[2, 3, -1, -1, 3, 4], [4, -1, 4], None, []]
    out = token_staleness_metrics(4, versions, 2)
    assert out == {
        mk.token_staleness(0): 3 / 6,
        mk.token_staleness(1): 2 / 6,
        mk.token_staleness(2): 1 / 6,
        mk.TRAJECTORIES_TWO_VERSIONS: 1 / 2,
        mk.STALENESS_TOKEN_MAX: 2.0,
    }


def test_no_versions_gives_no_token_metrics():
    assert token_staleness_metrics(3, [None, [], [-1, -1]], 1) == {}


def test_a_token_outside_the_bound_is_warned_and_left_out():
    with pytest.warns(RuntimeWarning, match="1 sampled token.*outside 0..1 at version 5"):
        out = token_staleness_metrics(5, [[5, 4, 2]], 1)
    assert out[mk.token_staleness(0)] == 0.5 and out[mk.token_staleness(1)] == 0.5


def test_busy_seconds_is_the_union_of_the_intervals_within_the_window():
    # window [10, 20]: [8, 12] -> 2 s, [11, 14] adds 2 s, [16, 18] 2 s, [19, 30] 1 s, [21, 22] outside
    assert busy_seconds([(8, 12), (11, 14), (16, 18), (19, 30), (21, 22)], 10, 20) == 7.0
    assert busy_seconds([], 0, 5) == 0.0
    assert busy_seconds([(0, 5), (1, 2)], 0, 5) == 5.0


def test_idle_ratios():
    assert idle_ratios(10.0, 4.0, 7.0) == {
        mk.TIME_ACTOR_IDLE_RATIO: 0.4,
        mk.TIME_ROLLOUT_IDLE_RATIO: pytest.approx(0.3),
    }
    assert idle_ratios(2.0, 3.0, 5.0) == {mk.TIME_ACTOR_IDLE_RATIO: 1.0, mk.TIME_ROLLOUT_IDLE_RATIO: 0.0}


def test_the_oldest_sampled_token_sets_a_trajectorys_staleness():
    # trained at 6: oldest sampled versions 4 ([5, 4, 6], observations -1 left out) and 6 ([6, -1, 6]) -> 2
    assert oldest_token_staleness(6, [[5, 4, -1, 6], [6, -1, 6], None, [-1]]) == 2
    assert oldest_token_staleness(6, [None, [], [-1]]) is None


def test_partial_rollout_refuses_a_token_older_than_k_and_names_the_trajectory():
    # k = 1, trained at 5: [5, 4] (oldest 1 version) is within the bound; [4, 3, 5] (oldest 2) is not
    check_token_bound(5, [[5, 4], [5, -1, 5], None], 1)
    with pytest.raises(
        StalenessBoundError, match=r"1 trajectory.*version 5.*max_staleness=1: s2-0001#0 \(2 versions\)"
    ):
        check_token_bound(5, [[5, 4], [4, 3, 5]], 1, names=["s2-0000#0", "s2-0001#0"])
