"""The batch pipeline on its own (runner/pipeline.py), over the fake agent loop of pipeline_fakes.py (no trainer,
no Ray): what it dispatches ahead, what it admits and at which head versions, the data position it reports for a
checkpoint, and a drain."""

from __future__ import annotations

import pytest
from pipeline_fakes import MemoryChannel, World, fake_groups, prompts

from rlinf_ext.config.loader import load_config
from rlinf_ext.protocol import channels as ch
from rlinf_ext.protocol.channels import KeyedChannel
from rlinf_ext.runner.data_order import batch_order
from rlinf_ext.runner.pipeline import BatchPipeline

BATCH, GROUP, STEPS = 2, 2, 4


def pipeline(world: World, k: int) -> BatchPipeline:
    cfg = load_config(
        "tiny-cpu",
        [
            f"data.rollout_batch_size={BATCH}",
            f"algorithm.group_size={GROUP}",
            "data.shuffle=false",
            "runner.seed=7",
            "algorithm.n_minibatches=1",
            "algorithm.training_batch_size_per_gpu=2",
            "data.val_data_paths=[]",
        ],
    )
    channel = MemoryChannel()
    channels = {name: KeyedChannel(channel, name) for name in ch.STEP_CHANNELS}
    return BatchPipeline(cfg, fake_groups(world), channels, k, batch_order(cfg, 8), prompts(8), STEPS)


def dispatched(world: World) -> list[tuple[int, list[str]]]:
    return [(b, [u.split("-", 2)[2] for u in request.uids]) for b, _, request in world.dispatched]


def test_batches_go_out_k_ahead_and_are_admitted_in_order_with_their_dispatch_versions():
    world = World(GROUP)
    pipe = pipeline(world, k=1)
    pipe.start()
    first = pipe.next_batch(0)
    assert dispatched(world) == [(0, ["q0", "q1"]), (1, ["q2", "q3"])]  # batch 1 runs ahead of step 0
    assert [request.priority for _, _, request in world.dispatched] == [0, 1]  # the engines serve batch 0 first
    assert (first.batch, first.num_results, first.head_versions, pipe.position()) == (0, BATCH, [0, 0], 1)
    pipe.synced(1)
    second = pipe.next_batch(1)
    assert dispatched(world)[-1] == (2, ["q4", "q5"])
    # batch 1 was dispatched before the sync, batch 2 after: its groups will carry version 1
    assert second.head_versions == [0, 0] and pipe.in_flight[0].version == 1
    assert pipe.position() == 2  # the batch read ahead is not counted: a resume reads it again


def test_the_last_step_reads_nothing_ahead_and_a_drain_leaves_nothing_in_flight():
    world = World(GROUP)
    pipe = pipeline(world, k=2)
    pipe.start()
    for step in range(STEPS - 1):
        pipe.synced(step)  # as the trainer does before each step
        pipe.next_batch(step)
    assert [b for b, _ in dispatched(world)] == [0, 1, 2, 3]  # never past the last step (3)
    assert pipe.drain() == [(3, None)] and not pipe.in_flight and pipe.position() == 3


def test_a_batch_fed_by_the_caller_is_refused_while_batches_are_in_flight():
    world = World(GROUP)
    pipe = pipeline(world, k=1)
    pipe.start()
    pipe.next_batch(0)
    with pytest.raises(RuntimeError, match="1 batch\\(es\\) in flight"):
        pipe.next_batch(1, prompts(2))


def test_batches_wait_for_weights_within_k_when_syncs_are_skipped():
    """runner.sync_every: batch b goes out only once the engines hold version b - k or later."""
    world = World(GROUP)
    pipe = pipeline(world, k=1)
    pipe.start()
    pipe.next_batch(0)
    pipe.next_batch(1)  # no sync after step 0: the engines hold version 0, so batch 2 waits
    assert [b for b, _ in dispatched(world)] == [0, 1]
    pipe.synced(2)
    assert pipe.next_batch(2).head_versions == [2, 2] and [b for b, _ in dispatched(world)] == [0, 1, 2, 3]


def test_a_sync_is_due_every_n_steps_and_whenever_the_weights_are_older_than_k():
    from rlinf_ext.runner.pipeline import sync_due

    assert [s for s in range(7) if sync_due(s, s - s % 2, 2, 1)] == [0, 2, 4, 6]
    assert sync_due(3, 1, 2, 1)  # version 1 is 2 steps old at step 3: past k = 1
    assert not sync_due(1, 0, 2, 1) and sync_due(1, 0, 1, 1)
    assert sync_due(5, 0, 3, 2) and not sync_due(2, 0, 3, 2)  # a resume at step 5 starts on version 0
