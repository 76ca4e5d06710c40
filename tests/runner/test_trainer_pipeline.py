"""The driver with batches dispatched ahead (``runner.max_staleness = k``), on the fake workers of
pipeline_fakes.py (no Ray): step b trains exactly batch b's uids for k = 0, 1, 2, with the same prompts and seeds
whatever k is; at most k + 1 batches are in flight; head staleness is min(b, k); a stop checkpoints, drains the
batches in flight and leaves nothing pending; a resume trains the same uids in the same order as the uninterrupted
run (also across an epoch end); k = 0 keeps today's worker calls, requests and metrics."""

from __future__ import annotations

import math

import pytest
from group_fakes import SYNC, c, w
from pipeline_fakes import AGENT_LOOP_CALL, MemoryChannel, World, fake_groups, prompts

from rlinf_ext.config.loader import load_config
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner import trainer as trainer_module
from rlinf_ext.runner.trainer import GRPOTrainer

SEED = 7
BATCH, GROUP = 2, 2
PROMPTS = 8  # 4 steps per epoch


def make_cfg(out_dir, k: int, steps: int, **extra):
    overrides = {"runner.output_dir": str(out_dir), "runner.experiment_name": "t", "runner.max_steps": steps,
                 "runner.max_epochs": 3, "runner.save_interval": -1, "runner.seed": SEED, "runner.max_staleness": k,
                 "data.rollout_batch_size": BATCH, "algorithm.group_size": GROUP, "data.val_data_paths": "[]",
                 "runner.val_before_train": "false", "runner.val_check_interval": -1, "data.seed": 3, "algorithm.n_minibatches": 1,
                 "algorithm.training_batch_size_per_gpu": 2, "rollout.return_logprobs": "true", **extra}
    return load_config("tiny-cpu", [f"{key}={value}" for key, value in overrides.items()])


@pytest.fixture(autouse=True)
def memory_channels(monkeypatch):
    monkeypatch.setattr(trainer_module, "Channel", MemoryChannel)


def run(out_dir, k: int, steps: int = 6, stop_after: int | None = None, behaviour: bool = False, **extra):
    """(trainer, world, metrics per step, summary) of one run on fresh fake workers."""
    world = World(GROUP)
    world.behaviour_metrics = behaviour
    metrics: dict[int, dict] = {}
    cfg = make_cfg(out_dir, k, steps, **extra)
    trainer = GRPOTrainer(cfg, fake_groups(world), prompts(PROMPTS), on_step=lambda s, m, t: metrics.setdefault(s, m))
    if stop_after is not None:
        trainer.should_stop = lambda: trainer.global_step >= stop_after
    trainer.init_workers()
    summary = trainer.run()
    return trainer, world, metrics, summary


def nothing_pending(trainer, world) -> bool:
    return not trainer.in_flight and all(c["handle"].finished for c in world.rollouts)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_step_b_trains_exactly_batch_b(tmp_path, k):
    trainer, world, metrics, summary = run(tmp_path, k, behaviour=True)
    steps = range(6)
    assert summary["steps"] == 6 and sorted(world.requests) == list(steps)
    for b in steps:
        uids = world.requests[b].uids
        assert all(u.startswith(f"s{b}-") for u in uids)
        assert world.requests[b].seed == SEED * 1_000_003 + b
        assert sorted(world.rewarded[b]) == world.trained[b] == sorted(uids), b
        m = metrics[b + 1]
        assert m[mk.STALENESS_HEAD_MAX] == m[mk.STALENESS_HEAD_MEAN] == min(b, k)
        shares = [m[mk.token_staleness(j)] for j in range(k + 1)]
        assert math.isclose(sum(shares), 1.0) and mk.token_staleness(k + 1) not in m
        # fake tokens: two at the dispatch version, two at the version when the batch finished (step b)
        assert m[mk.token_staleness(min(b, k))] >= 0.5
        assert m[mk.TRAJECTORIES_TWO_VERSIONS] == (1.0 if min(b, k) else 0.0)
        assert 0.0 <= m[mk.TIME_ACTOR_IDLE_RATIO] <= 1.0 and 0.0 <= m[mk.TIME_ROLLOUT_IDLE_RATIO] <= 1.0
        assert (m[mk.ACTOR_BEHAVIOUR_WEIGHT_MEAN], m[mk.ACTOR_BEHAVIOUR_WEIGHT_CLIP_FRACTION],
                m[mk.ACTOR_BEHAVIOUR_KL]) == (0.9, 0.25, 0.01)
    assert world.most_in_flight == k + 1
    assert nothing_pending(trainer, world)


def test_the_same_prompts_and_seeds_whatever_k(tmp_path):
    runs = {k: run(tmp_path / str(k), k)[1] for k in (0, 1, 2)}
    for k in (1, 2):
        for b in range(6):
            assert runs[k].requests[b] == runs[0].requests[b], (k, b)
        assert runs[k].trained == runs[0].trained


@pytest.mark.parametrize("k,stop_after", [(1, 2), (2, 2), (1, 4)])  # 4: the end of the first epoch
def test_stop_drains_and_resume_trains_the_same_uids(tmp_path, k, stop_after):
    _, whole, _, _ = run(tmp_path / "whole", k)
    trainer, first, _, summary = run(tmp_path / "cut", k, stop_after=stop_after)
    assert summary["stopped_early"] and summary["steps"] == stop_after
    assert summary["checkpoint_dir"].endswith(f"global_step_{stop_after}")
    # the batches read ahead were dispatched, then waited for and discarded: nothing left pending
    assert max(first.requests) == min(stop_after + k - 1, 5) and nothing_pending(trainer, first)
    assert sorted(first.trained) == list(range(stop_after))

    resumed, second, metrics, summary = run(tmp_path / "cut", k, **{"runner.resume_dir": "auto"})
    assert second.loads and summary["steps"] == 6 and summary["steps_this_run"] == 6 - stop_after
    assert {**first.trained, **second.trained} == whole.trained
    for b in range(stop_after, 6):
        assert second.requests[b] == whole.requests[b]
        # the pipeline refills at the resumed version: batch b was dispatched at stop_after or later
        assert metrics[b + 1][mk.STALENESS_HEAD_MAX] == min(b - stop_after, k)
    assert nothing_pending(resumed, second)


STEP = SYNC + [
    c(AGENT_LOOP_CALL), c("reward.compute_rewards"), c("actor.run_inference"), c("actor.run_training"),
    w(AGENT_LOOP_CALL), w("reward.compute_rewards"), w("actor.run_inference"), w("actor.run_training"),
    c("rollout.offload_engine"), w("rollout.offload_engine"),
]
SAVE = [c("actor.save_checkpoint"), w("actor.save_checkpoint")]
# what the trainer before runner.max_staleness produced on these fakes (same seeds, 3 steps; its time/* vary)
TODAY_UIDS = {0: ["s0-0000-q2", "s0-0001-q4"], 1: ["s1-0000-q3", "s1-0001-q5"], 2: ["s2-0000-q1", "s2-0001-q0"]}
TODAY_METRICS = {
    step: {"reward/mean": reward, "agent/turns": 2.0, "rollout/reward_scores": 0.0, "actor/loss": loss,
           "actor/lr": 1e-06, "actor/optimizer_steps": 1.0}
    for step, reward, loss in ((1, 0.5, 0.5), (2, 0.75, 1.5), (3, 0.25, 2.5))
}
TODAY_TIMES = {"time/rollout", "time/tool", "time/recompute", "time/train", "time/step", "time/sync",
               "throughput/tokens_per_s"}
NEW_AT_K0 = {mk.STALENESS_HEAD_MAX, mk.STALENESS_HEAD_MEAN, mk.token_staleness(0), mk.TRAJECTORIES_TWO_VERSIONS,
             mk.TIME_WAIT_ROLLOUT, mk.TIME_ACTOR_IDLE_RATIO, mk.TIME_ROLLOUT_IDLE_RATIO}


def test_k0_keeps_todays_calls_requests_and_metrics(tmp_path):
    trainer, world, metrics, _ = run(tmp_path, 0, steps=3, **{"runner.save_interval": 1})
    init_end = world.log.index(c("rollout.rollout_serverless")) + 1
    assert world.log[init_end:] == (STEP + SAVE) * 3
    assert {b: r.uids for b, r in world.requests.items()} == TODAY_UIDS
    assert [r.seed for r in world.requests.values()] == [SEED * 1_000_003 + b for b in range(3)]
    for step, expected in TODAY_METRICS.items():
        assert {key: metrics[step][key] for key in expected} == expected, step
        assert set(metrics[step]) - {mk.TIME_ROLLOUT_START} == set(expected) | TODAY_TIMES | NEW_AT_K0
    # the new metrics at k = 0: nothing is stale
    assert all(metrics[s][mk.STALENESS_HEAD_MAX] == 0 and metrics[s][mk.token_staleness(0)] == 1.0 for s in (1, 2, 3))
