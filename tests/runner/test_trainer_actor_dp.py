"""Data-parallel actor through the CPU runner: ``cluster.component_placement`` with ``actor: 0-1`` starts two
actor processes (RLinf ranks, gloo) that train one step end to end; a batch they cannot share is refused
before anything starts. The update itself is checked against one process in tests/training/test_data_parallel.py."""

import math

import pytest
import torch
from trainer_helpers import kill_groups, make_cfg, make_trainer

pytestmark = pytest.mark.timeout(600)

DP2 = {"cluster.component_placement": "{actor: 0-1, rollout: 0, reward: 0}"}


@pytest.mark.slow
def test_two_actor_processes_train_a_step(tiny_assets, tmp_path, cluster, retrieval_url):
    cfg = make_cfg(tiny_assets, tmp_path, retrieval_url, **DP2, **{"runner.save_interval": 1})
    seen = {}
    trainer = make_trainer(cfg, cluster, retrieval_url, on_step=lambda s, m, t: seen.update({s: (m, t)}))
    groups = trainer.groups
    try:
        assert groups.placement.actor_world_size == 2
        trainer.init_workers()
        before = groups.actor.parameter_checksum().wait()
        assert len(before) == 2 and before[0] == before[1]
        summary = trainer.run()
        assert summary["steps"] == 1 and summary["checkpoint_dir"]
        metrics, trajectories = seen[1]
        assert math.isfinite(metrics["actor/loss"]) and math.isfinite(metrics["actor/grad_norm"])
        assert metrics["actor/optimizer_steps"] == 2.0  # n_minibatches=2 over the global batch
        # rank 0's metrics are global: every trajectory of the step, every loss token
        assert len(trajectories) == 4 and metrics["rollout/total_num_sequence"] == 4.0
        assert metrics["rollout/loss_tokens"] == float(sum(sum(t["response_mask"]) for t in trajectories))
        # both ranks trained and hold identical weights
        after = groups.actor.parameter_checksum().wait()
        assert after[0] == after[1] and after[0] != before[0]
        # rank 0 synced them to the rollout (logits check passed) and wrote the checkpoint with both RNG states
        state = groups.rollout.get_state().wait()[0]
        assert state["last_sync_logit_diff"] is not None and state["last_sync_logit_diff"] < 1e-3
        ckpt = torch.load(
            f"{summary['checkpoint_dir']}/actor/iter_0000001/mp_rank_00/model_optim_rng.pt", weights_only=False
        )
        assert len(ckpt["rng_state"]) == 2
    finally:
        trainer.shutdown()
        kill_groups(groups)


def NoGpuCluster():  # noqa: N802 - stands for RLinf's Cluster, of which launch reads the GPU count only
    from rlinf.scheduler import Cluster

    from tests.support.signature_checks import attributes_of

    return attributes_of(Cluster, num_accelerators=0)


def test_cpu_launch_refuses_a_batch_the_actor_processes_cannot_share(tiny_assets, tmp_path):
    from rlinf_ext.runner.compose import launch_worker_groups
    from rlinf_ext.runner.groups import WorkerStartupError

    cfg = make_cfg(
        tiny_assets,
        tmp_path,
        "http://127.0.0.1:1",
        **DP2,
        **{"data.rollout_batch_size": 4, "algorithm.n_minibatches": 1},
    )
    # `validate` already refuses 3 prompts on 2 ranks (tests/config/test_rules.py); a config changed after
    # validation (programmatic use) is still refused here, before any worker starts
    cfg.data.rollout_batch_size = 3
    with pytest.raises(WorkerStartupError) as info:  # before any worker starts: no Ray needed
        launch_worker_groups(cfg, NoGpuCluster())
    text = str(info.value)
    assert info.value.component == "actor" and "3 rollout results" in text and "2 data-parallel processes" in text
    assert "data.rollout_batch_size a multiple of 2 (e.g. 4)" in text
