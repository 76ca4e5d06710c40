"""benchmarks/async_sim.py: the pipeline's simulation on tiny cases computed by hand (one trajectory per batch, fixed
times), and the calibration's inputs read from a measured run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sim():
    return load_script(REPO / "benchmarks" / "async_sim.py")


def one_turn(sim, **changes):
    """A batch is one trajectory of one 3 s turn and no search; the actor works 1 s per step, a sync takes 0.5 s."""
    fields = dict(
        trajectories=1, group_size=1, calls=(1.0,), engine="continuous", slots=8, turn_s=3.0, train_s=1.0, sync_s=0.5
    )
    return sim.Scenario(**{**fields, **changes})


def test_two_batches_k0_then_k1(sim):
    # k=0: batch 0 0-3, train 3-4; sync 4-4.5, batch 1 4.5-7.5, train 7.5-8.5
    assert sim.simulate(one_turn(sim), sim.Policy(0), steps=2).step_end == [4.0, 8.5]
    # k=1: both batches 0-3; train 3-4; sync 4-4.5, batch 1 is in: train 4.5-5.5
    r = sim.simulate(one_turn(sim), sim.Policy(1), steps=2)
    assert r.step_end == [4.0, 5.5] and r.wait_s == [3.0, 0.0]
    assert r.per_s == pytest.approx(2 / 5.5)


def test_shared_cores_slow_both_while_both_work(sim):
    # train 2 s, k=1, 3 steps. Alone: batches 0, 1 0-3, train 3-5; sync 5-5.5, batch 2 5.5-8.5 while training
    # 5.5-7.5; sync at 7.5 waits for batch 2's turn (8.5), 8.5-9; train 9-11
    assert sim.simulate(one_turn(sim, train_s=2.0), sim.Policy(1), steps=3).step_end == [5.0, 7.5, 11.0]
    # both at half speed while both work: 5.5-9.5 the actor's 2 s and 2 of the turn's 3; the turn ends 10.5, the
    # sync waits for it: 10.5-11, train 11-13
    shared = one_turn(sim, train_s=2.0, gen_slowdown=2.0, train_slowdown=2.0)
    assert sim.simulate(shared, sim.Policy(1), steps=3).step_end == [5.0, 9.5, 13.0]


def test_partial_rollout_does_not_wait_for_a_later_batch(sim):
    # k=2, train 2: batches 0-2 0-3; train 3-5; sync 5-5.5, batch 3 5.5-8.5; train 5.5-7.5. Step 2's sync at 7.5:
    # waiting for batch 3's turn: 8.5-9, train 9-11, sync 11-11.5, train 11.5-13.5
    sc = one_turn(sim, train_s=2.0)
    assert sim.simulate(sc, sim.Policy(2), steps=4).step_end == [5.0, 7.5, 11.0, 13.5]
    # partial: the sync 7.5-8 holds batch 3 (now 5.5-9), train 8-10; sync 10-10.5, train 10.5-12.5
    assert sim.simulate(sc, sim.Policy(2, partial=True), steps=4).step_end == [5.0, 7.5, 10.0, 12.5]


def test_the_engine_queue_serves_the_oldest_batch_first(sim):
    # one turn at a time; a batch is one group of 2 trajectories: turn 3 s, a 1 s search, turn 3 s; k=1 queues
    # batch 0's two trajectories, then batch 1's. 0-3 b0t0, 3-6 b0t1 (b0t0's second turn queued at 4).
    sc = sim.Scenario(
        trajectories=2,
        group_size=2,
        calls=(0.0, 1.0),
        tool_median_s=1.0,
        tool_p99_s=1.0,
        engine="batched",
        slots=1,
        turn_s=3.0,
        train_s=1.0,
        sync_s=0.5,
    )
    # by batch: 6-9 b0t0's second turn, 9-12 b0t1's (queued at 7): batch 0 in at 12, trained 12-13
    assert sim.simulate(sc, sim.Policy(1), steps=2).step_end[0] == 13.0
    # arrival order: b1t0 and b1t1 (queued at 0) go first, 6-12; then batch 0's second turns 12-18; trained 18-19
    assert sim.simulate(sc, sim.Policy(1, priority=False), steps=2).step_end[0] == 19.0


def test_group_admission_and_a_sync_every_n_steps(sim):
    # one group per batch: group admission trains what batch admission does
    sc = one_turn(sim, train_s=2.0)
    assert sim.simulate(sc, sim.Policy(1, "group"), steps=3).step_end == [5.0, 7.5, 11.0]
    # a sync every 2 steps at k=1: batch 2 waits for version 2 (step 2's sync 7-7.5): 7.5-10.5, train 10.5-12.5
    assert sim.simulate(sc, sim.Policy(1, sync_every=2), steps=3).step_end == [5.0, 7.0, 12.5]
    with pytest.raises(ValueError, match="sync_every=2 with k=0"):
        sim.simulate(sc, sim.Policy(0, sync_every=2), steps=3)


def test_draws_follow_the_batch_not_the_policy(sim):
    sc = sim.Scenario()
    assert sim.draw_batch(sc, 3, 5) == sim.draw_batch(sc, 3, 5) != sim.draw_batch(sc, 3, 6)
    assert len(sim.draw_batch(sc, 0, 0)) == sc.trajectories


def test_measured_means_read_the_benchmark_json(sim):
    runs = [
        {
            "setting": {"k": 0, "admission": "batch", "partial": False},
            "trajectories_per_s": 10.0,
            "time_rollout_s": 4.0,
            "wait_rollout_s": 3.0,
            "time_train_s": 1.5,
            "time_sync_s": 0.1,
            "elapsed_s": [5.0, 11.0, 17.0],
        }
    ]
    m = sim.measured_means(runs)[sim.Policy(0)]
    assert m["step_s"] == pytest.approx(17.0 / 3) and m["after_first"] == pytest.approx(64 * 2 / 12.0)
