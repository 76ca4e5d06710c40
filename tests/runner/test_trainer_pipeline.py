"""The driver with batches dispatched ahead (``runner.max_staleness = k``), on the fake workers of
pipeline_fakes.py (no Ray): step b trains exactly batch b's uids for k = 0, 1, 2, with the same prompts and seeds
whatever k is; at most k + 1 batches are in flight; head staleness is min(b, k); a stop checkpoints, drains the
batches in flight and leaves nothing pending; a resume trains the same uids in the same order as the uninterrupted
run, at and inside later epochs, after a stop or a crash (resume from the last periodic checkpoint); k = 0 keeps
today's worker calls, requests and metrics."""

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
    overrides = {
        "runner.output_dir": str(out_dir),
        "runner.experiment_name": "t",
        "runner.max_steps": steps,
        "runner.max_epochs": 3,
        "runner.save_interval": -1,
        "runner.seed": SEED,
        "runner.max_staleness": k,
        "data.rollout_batch_size": BATCH,
        "algorithm.group_size": GROUP,
        "data.val_data_paths": "[]",
        "runner.val_before_train": "false",
        "runner.val_check_interval": -1,
        "data.seed": 3,
        "algorithm.n_minibatches": 1,
        "algorithm.training_batch_size_per_gpu": 2,
        "rollout.return_logprobs": "true",
        **extra,
    }
    return load_config("tiny-cpu", [f"{key}={value}" for key, value in overrides.items()])


@pytest.fixture(autouse=True)
def memory_channels(monkeypatch):
    monkeypatch.setattr(trainer_module, "Channel", MemoryChannel)


class Crash(RuntimeError):
    """What a test raises after a step to cut a run without a stop's checkpoint (a killed job)."""


def run(
    out_dir,
    k: int,
    steps: int = 6,
    stop_after: int | None = None,
    behaviour: bool = False,
    crash_after: int | None = None,
    failing_batches: tuple[int, ...] = (),
    slow: tuple[str, ...] = (),
    **extra,
):
    """(trainer, world, metrics per step, summary) of one run on fresh fake workers; ``crash_after``: raise
    ``Crash`` once that step is reported (its periodic checkpoint, if due, is written)."""
    world = World(GROUP)
    world.behaviour_metrics = behaviour
    world.failing_batches = set(failing_batches)
    world.slow = set(slow)
    metrics: dict[int, dict] = {}
    cfg = make_cfg(out_dir, k, steps, **extra)

    def on_step(step, step_metrics, _trajectories):
        metrics.setdefault(step, step_metrics)
        if step == crash_after:
            raise Crash(f"cut after step {step}")

    trainer = GRPOTrainer(cfg, fake_groups(world), prompts(PROMPTS), on_step=on_step)
    if stop_after is not None:
        trainer.should_stop = lambda: trainer.global_step >= stop_after
    trainer.init_workers()
    if crash_after is not None:
        with pytest.raises(Crash):
            trainer.run()
        return trainer, world, metrics, None
    summary = trainer.run()
    return trainer, world, metrics, summary


def nothing_pending(trainer, world) -> bool:
    return not trainer.pipeline.in_flight and all(c["handle"].finished for c in world.rollouts)


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
        assert (
            m[mk.ACTOR_BEHAVIOUR_WEIGHT_MEAN],
            m[mk.ACTOR_BEHAVIOUR_WEIGHT_CLIP_FRACTION],
            m[mk.ACTOR_BEHAVIOUR_KL],
        ) == (0.9, 0.25, 0.01)
    assert world.most_in_flight == k + 1
    assert nothing_pending(trainer, world)


@pytest.mark.parametrize("k, every, synced", [(1, 2, [0, 2, 4]), (2, 3, [0, 3])])
def test_a_sync_every_n_steps_keeps_every_batch_within_k(tmp_path, k, every, synced):
    """runner.sync_every: the weights go out at the due steps only, step b still trains batch b, and no group or
    token is older than k (the engines' version gates the dispatch)."""
    trainer, world, metrics, summary = run(tmp_path, k, **{"runner.sync_every": every})
    assert summary["steps"] == 6 and sorted(world.requests) == list(range(6))
    assert [s - 1 for s in range(1, 7) if mk.TIME_SYNC in metrics[s]] == synced

    def head_version(b: int) -> int:  # the engines' version at the first step that may dispatch batch b
        return next(v for s in range(6) for v in [max(x for x in synced if x <= s)] if b <= min(s, v) + k)

    for b in range(6):
        assert sorted(world.trained[b]) == sorted(world.requests[b].uids)
        assert metrics[b + 1][mk.STALENESS_HEAD_MAX] == b - head_version(b) <= k
        assert mk.token_staleness(k + 1) not in metrics[b + 1]


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


EPOCH = PROMPTS // BATCH  # steps per epoch
EPOCHS = 3


def prompt_uids(request) -> list[str]:
    """The prompt uids of a batch's request (``s<batch>-<k>-<prompt uid>``)."""
    return [uid.split("-", 2)[2] for uid in request.uids]


def assert_trains_the_uninterrupted_prompts(whole: World, *parts: World) -> None:
    """Every step of the cut runs trained (and asked with the seed of) exactly what the uninterrupted run did, and
    together they trained every step."""
    for part in parts:
        for b, request in part.requests.items():
            if b in part.trained:
                assert part.trained[b] == whole.trained[b], b
                assert request == whole.requests[b], b
    assert set().union(*(part.trained for part in parts)) == set(range(EPOCH * EPOCHS))


def test_each_epoch_trains_every_prompt_once_in_a_new_order(tmp_path):
    _, whole, _, summary = run(tmp_path, 0, steps=EPOCH * EPOCHS)
    assert summary["steps"] == EPOCH * EPOCHS
    orders = [
        [uid for b in range(e * EPOCH, (e + 1) * EPOCH) for uid in prompt_uids(whole.requests[b])]
        for e in range(EPOCHS)
    ]
    assert all(sorted(order) == sorted(p["uid"] for p in prompts(PROMPTS)) for order in orders)
    assert len({tuple(order) for order in orders}) == EPOCHS


@pytest.mark.parametrize("save_interval", [EPOCH, 3])  # at and off the epoch length
@pytest.mark.parametrize("cut", [2 * EPOCH, 2 * EPOCH + 2])  # the end of epoch 1, inside epoch 2
@pytest.mark.parametrize("k", [0, 1])
def test_a_stop_at_or_inside_a_later_epoch_resumes_the_uninterrupted_prompts(tmp_path, k, cut, save_interval):
    steps, interval = EPOCH * EPOCHS, {"runner.save_interval": save_interval}
    _, whole, _, _ = run(tmp_path / "whole", k, steps=steps, **interval)
    _, first, _, summary = run(tmp_path / "cut", k, steps=steps, stop_after=cut, **interval)
    assert summary["steps"] == cut and summary["checkpoint_dir"].endswith(f"global_step_{cut}")
    resumed, second, _, summary = run(tmp_path / "cut", k, steps=steps, **interval, **{"runner.resume_dir": "auto"})
    assert summary["steps"] == steps and summary["steps_this_run"] == steps - cut
    assert_trains_the_uninterrupted_prompts(whole, first, second)
    assert nothing_pending(resumed, second)


@pytest.mark.parametrize("save_interval,resumes_at", [(EPOCH, 2 * EPOCH), (3, 9)])  # a boundary; inside epoch 2
@pytest.mark.parametrize("k", [0, 1])
def test_a_crash_resumes_from_the_last_periodic_checkpoint_with_the_uninterrupted_prompts(
    tmp_path, k, save_interval, resumes_at
):
    steps, interval = EPOCH * EPOCHS, {"runner.save_interval": save_interval}
    _, whole, _, _ = run(tmp_path / "whole", k, steps=steps, **interval)
    _, first, _, _ = run(tmp_path / "cut", k, steps=steps, crash_after=steps - 1, **interval)
    _, second, _, summary = run(tmp_path / "cut", k, steps=steps, **interval, **{"runner.resume_dir": "auto"})
    assert summary["resumed_from"].endswith(f"global_step_{resumes_at}")
    assert summary["steps"] == steps and summary["steps_this_run"] == steps - resumes_at
    assert_trains_the_uninterrupted_prompts(whole, first, second)


def test_a_stop_is_clean_when_a_discarded_batch_fails(tmp_path, capsys):
    trainer, world, _, summary = run(tmp_path, 2, stop_after=2, failing_batches=(3,))
    assert summary["stopped_early"] and summary["steps"] == 2 and sorted(world.requests) == [0, 1, 2, 3]
    assert not trainer.pipeline.in_flight
    out = capsys.readouterr().out
    assert "2 batch(es) in flight after step 2 were aborted and discarded" in out
    assert "discarded batch 3 ended with RuntimeError: batch 3's rollout failed" in out


STEP = SYNC + [
    c(AGENT_LOOP_CALL),
    c("reward.compute_rewards"),
    c("actor.run_inference"),
    c("actor.run_training"),
    w(AGENT_LOOP_CALL),
    w("reward.compute_rewards"),
    w("actor.run_inference"),
    w("actor.run_training"),
    c("rollout.offload_engine"),
    w("rollout.offload_engine"),
]
SAVE = [c("actor.save_checkpoint"), w("actor.save_checkpoint")]
# what the trainer before runner.max_staleness produced on these fakes (same seeds, 3 steps; its time/* vary)
TODAY_UIDS = {0: ["s0-0000-q2", "s0-0001-q4"], 1: ["s1-0000-q3", "s1-0001-q5"], 2: ["s2-0000-q1", "s2-0001-q0"]}
TODAY_METRICS = {
    step: {
        "reward/mean": reward,
        "agent/turns": 2.0,
        "rollout/reward_scores": 0.0,
        "actor/loss": loss,
        "actor/lr": 1e-06,
        "actor/optimizer_steps": 1.0,
    }
    for step, reward, loss in ((1, 0.5, 0.5), (2, 0.75, 1.5), (3, 0.25, 2.5))
}
TODAY_TIMES = {
    "time/rollout",
    "time/tool",
    "time/recompute",
    "time/train",
    "time/step",
    "time/sync",
    "throughput/tokens_per_s",
}
NEW_AT_K0 = {
    mk.STALENESS_HEAD_MAX,
    mk.STALENESS_HEAD_MEAN,
    mk.token_staleness(0),
    mk.TRAJECTORIES_TWO_VERSIONS,
    mk.TIME_WAIT_ROLLOUT,
    mk.TIME_ACTOR_IDLE_RATIO,
    mk.TIME_ROLLOUT_IDLE_RATIO,
}


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


# ---------------------------------------------------------------- runner.admission: group
GROUP_ADMISSION = {"runner.admission": "group"}
SLOW = ("q2", "q1", "q7")  # batch 0 is [q2, q4] (TODAY_UIDS): its first group finishes last


def trained_uids(*worlds: World) -> list[str]:
    return [uid for world in worlds for step in sorted(world.trained) for uid in world.trained[step]]


@pytest.mark.parametrize("k", [1, 2])
def test_group_admission_trains_finished_groups_of_later_batches_within_k(tmp_path, k):
    _, world, metrics, summary = run(tmp_path, k, slow=SLOW, **GROUP_ADMISSION)
    assert summary["steps"] == 6
    # step 0 does not wait for q2's slow group: batch 1's first finished group takes its place
    assert world.trained[0] == ["s0-0001-q4", "s1-0000-q3"]
    assert "s0-0000-q2" in world.trained[k]  # trained at its last chance, k steps after its dispatch
    uids = trained_uids(world)
    assert len(uids) == len(set(uids)) == 6 * BATCH  # every prompt dispatched is trained once
    assert sorted(uids) == sorted(u for r in world.requests.values() for u in r.uids)
    for step in range(1, 7):
        assert 0 <= metrics[step][mk.STALENESS_HEAD_MAX] <= k
        assert sorted(world.rewarded[step - 1]) == world.trained[step - 1]
    assert world.most_untrained == (k + 1) * BATCH  # the in-flight cap: k + 1 batches of groups


def test_group_admission_at_k0_is_batch_admission(tmp_path):
    _, by_batch, _, _ = run(tmp_path / "batch", 0)
    _, by_group, _, _ = run(tmp_path / "group", 0, slow=SLOW, **GROUP_ADMISSION)
    assert by_group.trained == by_batch.trained and by_group.requests == by_batch.requests


@pytest.mark.parametrize("k,stop_after", [(1, 2), (2, 3)])
def test_group_admission_stop_and_resume_trains_every_prompt_once(tmp_path, k, stop_after):
    _, whole, _, _ = run(tmp_path / "whole", k, slow=SLOW, **GROUP_ADMISSION)
    _, first, _, summary = run(tmp_path / "cut", k, stop_after=stop_after, slow=SLOW, **GROUP_ADMISSION)
    assert summary["steps"] == stop_after
    resumed, second, metrics, summary = run(
        tmp_path / "cut", k, slow=SLOW, **GROUP_ADMISSION, **{"runner.resume_dir": "auto"}
    )
    assert summary["steps"] == 6 and nothing_pending(resumed, second)
    uids = trained_uids(first, second)
    assert len(uids) == len(set(uids)) and sorted(uids) == sorted(trained_uids(whole))
    # the prompts in flight at the stop are dispatched again first, with their batch's uids and seed
    carried = [u for r in first.requests.values() for u in r.uids if u not in trained_uids(first)]
    assert carried and [u for _, _, r in second.dispatched for u in r.uids][: len(carried)] == carried
    assert all(r.seed == whole.requests[b].seed for b, _, r in second.dispatched)
    assert all(metrics[step][mk.STALENESS_HEAD_MAX] <= k for step in range(stop_after + 1, 7))


def test_a_group_admission_checkpoint_with_prompts_in_flight_refuses_batch_admission(tmp_path):
    run(tmp_path, 1, stop_after=2, slow=SLOW, **GROUP_ADMISSION)
    with pytest.raises(ValueError, match="runner.admission=group"):
        run(tmp_path, 1, **{"runner.resume_dir": "auto"})


def test_below_the_full_cap_a_slow_group_never_holds_a_step_it_is_not_due_in(tmp_path):
    # k = 2 with two batches untrained at once: every group has a step of slack; q2's groups and q1's finish last
    _, world, metrics, _ = run(tmp_path, 2, slow=SLOW, **GROUP_ADMISSION, **{"runner.in_flight_batches": 2})
    assert world.most_untrained == 2 * BATCH
    late = {
        u for step, uids in world.trained.items() for u in uids if int(u.split("-")[0][1:]) < step
    }  # trained after the step batch admission trains it
    assert late and all(metrics[s][mk.STALENESS_HEAD_MAX] <= 2 for s in range(1, 7))
    assert any(u.endswith("-q2") for u in late)
    uids = trained_uids(world)
    assert len(uids) == len(set(uids)) == 6 * BATCH
