"""RLinf-scheduler runner on CPU: Ray cluster, HF rollout + Megatron actor groups, Search-R1 agent loop and
the search tool against the real retrieval server (BM25) on loopback. One cluster for the module."""

import math
import shutil

import pytest
import torch
from trainer_helpers import (
    kill_groups,
    make_cfg,
    make_trainer,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # slow: worker groups on a Ray cluster


def check_step(metrics, trajectories, group_size=2, batch=2):
    assert math.isfinite(metrics["actor/loss"]) and math.isfinite(metrics["actor/grad_norm"])
    for key in (
        "reward/mean",
        "agent/turns",
        "agent/searches",
        "time/rollout",
        "time/train",
        "time/sync",
        "time/recompute",
        "time/tool",
        "throughput/tokens_per_s",
        "actor/lr",
    ):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert len(trajectories) == group_size * batch and all(t["reward"] is not None for t in trajectories)
    # observation tokens (mask 0) appear exactly when the agent searched
    assert any(0 in t["response_mask"] for t in trajectories) == (metrics["agent/searches"] > 0)


# PPO with the Megatron critic (collocated in the actor's processes): the resume restores the critic beside the
# policy, so step 3's value loss after the resume equals the uninterrupted run's
PPO = {"algorithm.adv_type": "gae", "critic.use_critic_model": True, "critic.critic_warmup": 0, "critic.optim.lr": 1e-3}


def test_runner_steps_then_resume_equals_uninterrupted(tiny_assets, tmp_path, cluster, retrieval_url):
    """RLinf-scheduler runner on CPU, PPO with the critic: steps train (params and logprobs change, loss finite,
    sync checked); 3 uninterrupted steps == (2 steps, checkpoint, resume, 1 step), the critic's value loss
    included; a truncated newest checkpoint is skipped."""
    from rlinf_ext.protocol import metric_keys as mk
    from rlinf_ext.runner.trainer import GRPOTrainer

    cfg = make_cfg(
        tiny_assets,
        tmp_path / "a",
        retrieval_url,
        **{
            "runner.max_steps": 3,
            "runner.save_interval": 1,
            "algorithm.n_minibatches": 1,
            "algorithm.training_batch_size_per_gpu": 2,
            **PPO,
        },
    )
    metrics_a, trajs_a = {}, {}

    def record(step, metrics, trajectories):
        metrics_a[step], trajs_a[step] = metrics, trajectories

    trainer = make_trainer(cfg, cluster, retrieval_url, on_step=record)
    groups = trainer.groups
    try:
        trainer.init_workers()
        summary = trainer.run()
        assert summary["steps"] == 3 and summary["checkpoint_dir"]
        for step in (1, 2, 3):
            check_step(metrics_a[step], trajs_a[step])
            assert set(mk.CRITIC_METRICS) <= set(metrics_a[step]), metrics_a[step]
            assert math.isfinite(metrics_a[step][mk.CRITIC_VALUE_LOSS]), metrics_a[step]
        print(
            "searches per step:",
            [metrics_a[s]["agent/searches"] for s in (1, 2, 3)],
            "reward:",
            [metrics_a[s]["reward/mean"] for s in (1, 2, 3)],
        )
        # logprobs of step-1 trajectories: reference (= initial policy) vs the trained policy
        t1 = trajs_a[1]
        args = ([t["prompt_ids"] for t in t1], [t["response_ids"] for t in t1], [t["response_mask"] for t in t1])
        ref = groups.actor.compute_logprobs(*args, reference=True).wait()[0]
        now = groups.actor.compute_logprobs(*args).wait()[0]
        assert any(not torch.allclose(torch.tensor(a), torch.tensor(b)) for a, b in zip(ref, now))
        # weights reached the rollout engine through the mapping and passed the logits check
        state = groups.rollout.get_state().wait()[0]
        assert state["last_sync_logit_diff"] is not None and state["last_sync_logit_diff"] < 1e-3
        assert state["weight_version"] == 2  # synced before step 3, after 2 optimizer steps
        checksum_a = groups.actor.parameter_checksum().wait()[0]
        trainer.shutdown()

        # "interrupted" after step 2: a new run dir holding steps 1-2 and a step 3 truncated on disk
        ckpts_a = tmp_path / "a" / "t" / "checkpoints"
        ckpts_b = tmp_path / "b" / "t" / "checkpoints"
        ckpts_b.mkdir(parents=True)
        for step in (1, 2, 3):
            shutil.copytree(ckpts_a / f"global_step_{step}", ckpts_b / f"global_step_{step}")
        model_pt = ckpts_b / "global_step_3" / "actor" / "iter_0000003" / "mp_rank_00" / "model_optim_rng.pt"
        model_pt.write_bytes(model_pt.read_bytes()[:100])

        cfg_b = make_cfg(
            tiny_assets,
            tmp_path / "b",
            retrieval_url,
            **{
                "runner.max_steps": 3,
                "runner.save_interval": 1,
                "algorithm.n_minibatches": 1,
                "algorithm.training_batch_size_per_gpu": 2,
                "runner.resume_dir": "auto",
                **PPO,
            },
        )
        metrics_b = {}
        resumed = GRPOTrainer(cfg_b, groups, trainer.train_dataset, on_step=lambda s, m, t: metrics_b.setdefault(s, m))
        with pytest.warns(RuntimeWarning, match="global_step_3"):
            resumed.init_workers()  # same worker processes, re-initialised from HF, then the checkpoint
        assert resumed.resume_dir.name == "global_step_2" and resumed.global_step == 2
        summary = resumed.run()
        assert summary["steps"] == 3 and summary["steps_this_run"] == 1
        assert set(metrics_b) == {3}
        assert metrics_b[3]["reward/mean"] == metrics_a[3]["reward/mean"]
        assert metrics_b[3]["actor/loss"] == pytest.approx(metrics_a[3]["actor/loss"], abs=1e-6)
        for key in (mk.CRITIC_VALUE_LOSS, mk.CRITIC_VALUES_MEAN):  # the values before step 3's update: the critic's
            assert metrics_b[3][key] == pytest.approx(metrics_a[3][key], abs=1e-6), key  # restored weights
        checksum_b = groups.actor.parameter_checksum().wait()[0]
        assert checksum_b == pytest.approx(checksum_a, rel=1e-7)
        resumed.shutdown()
    finally:
        trainer.shutdown()
        kill_groups(groups)
