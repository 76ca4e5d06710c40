"""Dynamic sampling in the driver (``algorithm.adv_type: grpo_dynamic``), on the fake workers of pipeline_fakes.py:
a world whose rewards make some prompts' groups all equal. Kept, dropped and padded groups, the batches generated and
what each step trains are hand-computed from the file order (``data.shuffle=false``: batch i of an epoch holds
prompts q(2i), q(2i+1)); uids stay unique across refills; a refill's batches advance the data position, so a stop
and a resume train and request exactly what the uninterrupted run does; a run whose data ends early stops there with
a checkpoint."""

from __future__ import annotations

import pytest
import torch
from pipeline_fakes import MemoryChannel, World, fake_groups, prompts

from rlinf_ext.config.loader import load_config
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner import trainer as trainer_module
from rlinf_ext.runner.data_order import BATCHES_READ
from rlinf_ext.runner.pipeline import REFILL_SEED_STRIDE
from rlinf_ext.runner.trainer import GRPOTrainer

SEED = 7
BATCH, GROUP = 2, 2
PROMPTS = 8  # 4 batches per epoch, in file order


@pytest.fixture(autouse=True)
def memory_channels(monkeypatch):
    monkeypatch.setattr(trainer_module, "Channel", MemoryChannel)


def rewards_by_prompt(all_one: set[str], all_zero: set[str]):
    """A reward per (group uid, trajectory): 1.0 for every trajectory of ``all_one``'s prompts, 0.0 for
    ``all_zero``'s, 0.0/1.0 (mixed) for the others."""

    def reward(uid: str, index: int) -> float:
        prompt = uid.split("-", 2)[2]
        return 1.0 if prompt in all_one else 0.0 if prompt in all_zero else float(index % 2)

    return reward


# q0 all 1, q2 and q7 all 0: dropped; q1, q3, q4, q5, q6 mixed: kept
MOSTLY_MIXED = rewards_by_prompt({"q0"}, {"q2", "q7"})


def run(out_dir, reward=MOSTLY_MIXED, steps: int = 4, stop_after: int | None = None, **extra):
    world = World(GROUP)
    world.reward = reward
    metrics: dict[int, dict] = {}
    overrides = {
        "runner.output_dir": str(out_dir),
        "runner.experiment_name": "t",
        "runner.max_steps": steps,
        "runner.max_epochs": 3,
        "runner.save_interval": -1,
        "runner.seed": SEED,
        "data.shuffle": "false",
        "data.rollout_batch_size": BATCH,
        "algorithm.group_size": GROUP,
        "data.val_data_paths": "[]",
        "runner.val_before_train": "false",
        "runner.val_check_interval": -1,
        "algorithm.n_minibatches": 1,
        "algorithm.training_batch_size_per_gpu": 2,
        "algorithm.adv_type": "grpo_dynamic",
        "algorithm.max_num_gen_batches": 3,
        **extra,
    }
    cfg = load_config("tiny-cpu", [f"{key}={value}" for key, value in overrides.items()])
    trainer = GRPOTrainer(
        cfg, fake_groups(world), prompts(PROMPTS), on_step=lambda step, m, _t: metrics.setdefault(step, m)
    )
    if stop_after is not None:
        trainer.should_stop = lambda: trainer.global_step >= stop_after
    trainer.init_workers()
    return trainer, world, metrics, trainer.run()


def dynamic_metrics(m: dict) -> tuple[float, float, float, float]:
    return (
        m[mk.DYNAMIC_KEPT_GROUPS],
        m[mk.DYNAMIC_DROPPED_GROUPS],
        m[mk.DYNAMIC_GEN_BATCHES],
        m[mk.DYNAMIC_PADDED_GROUPS],
    )


def position(run_dir, step: int) -> int:
    return torch.load(run_dir / "t" / "checkpoints" / f"global_step_{step}" / "data" / "data.pt")[BATCHES_READ]


def test_all_equal_groups_are_dropped_and_refilled_from_the_data_order(tmp_path):
    trainer, world, metrics, summary = run(tmp_path)
    assert summary["steps"] == 4
    # step 1: batch 0 [q0 drop, q1 keep] + refill batch 1 [q2 drop, q3 keep]
    # step 2: batch 2 [q4, q5] both kept, no refill
    # step 3: batch 3 [q6 keep, q7 drop] + refill batch 4 = epoch 1's first [q0 drop, q1 keep]
    # step 4: batch 5 [q2 drop, q3 keep] + refill batch 6 [q4 keep, q5 keep]: q5 is surplus
    assert world.trained == {
        0: ["s0-0001-q1", "s0r1-0001-q3"],
        1: ["s1-0000-q4", "s1-0001-q5"],
        2: ["s2-0000-q6", "s2r1-0001-q1"],
        3: ["s3-0001-q3", "s3r1-0000-q4"],
    }
    assert [dynamic_metrics(metrics[s]) for s in (1, 2, 3, 4)] == [
        (2.0, 2.0, 2.0, 0.0),
        (2.0, 0.0, 1.0, 0.0),
        (2.0, 2.0, 2.0, 0.0),
        (2.0, 1.0, 2.0, 0.0),
    ]
    # the requests: each step's batch, then its refills, from the run's order, with seeds of their own
    assert [(b, r, [u.split("-", 2)[2] for u in req.uids]) for b, r, req in world.dispatched] == [
        (0, 0, ["q0", "q1"]),
        (0, 1, ["q2", "q3"]),
        (1, 0, ["q4", "q5"]),
        (2, 0, ["q6", "q7"]),
        (2, 1, ["q0", "q1"]),
        (3, 0, ["q2", "q3"]),
        (3, 1, ["q4", "q5"]),
    ]
    assert [req.seed for b, r, req in world.dispatched] == [
        SEED * 1_000_003 + b + r * REFILL_SEED_STRIDE for b, r, _ in world.dispatched
    ]
    uids = [u for _, _, req in world.dispatched for u in req.uids]
    assert len(set(uids)) == len(uids)
    # reward/... spans every group the step generated: step 1's 4 groups of 2 are 1,1 | 0,1 | 0,0 | 0,1
    assert metrics[1][mk.REWARD_MEAN] == pytest.approx(4 / 8)
    assert metrics[1]["agent/turns"] == 2.0 and metrics[1][mk.ACTOR_LOSS] == 0.5
    assert trainer.pipeline.position() == 7  # 7 batches read over 4 steps
    assert not any(trainer._channel.queues.values())  # every group read, the dropped ones included


def test_after_max_num_gen_batches_the_kept_groups_train_padded_to_a_share_unit(tmp_path):
    """Only q1 is mixed. algorithm.n_minibatches=4 over groups of 2: a step trains whole pairs of groups (8
    trajectories / 4 minibatches needs an even count of groups), so a lone kept group takes one dropped group."""
    only_q1 = rewards_by_prompt(set(), {f"q{i}" for i in range(PROMPTS) if i != 1})
    _, world, metrics, _ = run(
        tmp_path,
        reward=only_q1,
        steps=2,
        **{
            "algorithm.max_num_gen_batches": 2,
            "algorithm.n_minibatches": 4,
            "algorithm.training_batch_size_per_gpu": 1,
        },
    )
    # step 1: batches 0 [q0, q1] and 1 [q2, q3]: q1 kept, padded with the first dropped group, q0
    # step 2: batches 2 [q4, q5] and 3 [q6, q7]: nothing kept, one unit of dropped groups (zero advantage)
    assert world.trained == {0: ["s0-0000-q0", "s0-0001-q1"], 1: ["s1-0000-q4", "s1-0001-q5"]}
    assert dynamic_metrics(metrics[1]) == (1.0, 3.0, 2.0, 1.0)
    assert dynamic_metrics(metrics[2]) == (0.0, 4.0, 2.0, 2.0)


def test_a_stop_and_resume_train_and_request_what_the_uninterrupted_run_does(tmp_path):
    _, whole, whole_metrics, _ = run(tmp_path / "whole")
    _, first, _, summary = run(tmp_path / "cut", stop_after=2)
    assert summary["stopped_early"] and summary["steps"] == 2
    assert position(tmp_path / "cut", 2) == 3  # batches 0, 1 (step 1's refill) and 2
    resumed, second, metrics, summary = run(tmp_path / "cut", **{"runner.resume_dir": "auto"})
    assert second.loads and summary["steps"] == 4 and summary["steps_this_run"] == 2
    assert {**first.trained, **second.trained} == whole.trained
    assert first.dispatched + second.dispatched == whole.dispatched  # same batches, refills, uids and seeds
    assert [dynamic_metrics(metrics[s]) for s in (3, 4)] == [dynamic_metrics(whole_metrics[s]) for s in (3, 4)]


def test_a_run_whose_data_ends_early_stops_there_with_a_checkpoint(tmp_path):
    """One epoch = 4 batches: step 3's refill finds no batch left, so it trains its one kept group (q6) and the
    run ends after 3 of its 4 planned steps."""
    _, world, metrics, summary = run(tmp_path, **{"runner.max_epochs": 1})
    assert summary["steps"] == 3 and summary["checkpoint_dir"].endswith("global_step_3")
    assert world.trained[2] == ["s2-0000-q6"] and dynamic_metrics(metrics[3]) == (1.0, 1.0, 1.0, 0.0)
    assert position(tmp_path, 3) == 4


def test_drop_without_refill_works_with_batches_dispatched_ahead(tmp_path):
    """algorithm.max_num_gen_batches=1 reads no extra batch, so it runs at runner.max_staleness=1: each step trains
    its own batch's mixed groups."""
    _, world, metrics, summary = run(
        tmp_path, **{"algorithm.max_num_gen_batches": 1, "runner.max_staleness": 1, "rollout.return_logprobs": "true"}
    )
    assert summary["steps"] == 4 and world.most_in_flight == 2
    assert world.trained == {0: ["s0-0001-q1"], 1: ["s1-0001-q3"], 2: ["s2-0000-q4", "s2-0001-q5"], 3: ["s3-0000-q6"]}
    assert [metrics[s][mk.DYNAMIC_GEN_BATCHES] for s in (1, 2, 3, 4)] == [1.0] * 4
