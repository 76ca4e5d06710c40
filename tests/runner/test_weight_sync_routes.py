"""Weight sync through real RLinf workers on a CPU Ray cluster: 2 data-parallel actor processes and 2 HF rollout
engines that start from DIFFERENT (randomised) weights, so a sync that loads nothing, or the wrong thing, fails
the logits check. Small buckets, so every sync has several (and, paired, several acknowledgements).

- paired (``actor: 0-1, rollout: 0-1``, the CPU stand-in of collocated GPUs): rollout rank r receives from actor
  rank r only, as shared-memory handles (a few hundred bytes per tensor cross the process boundary);
- broadcast (``actor: 0-1, rollout: 2-3``, as disaggregated GPUs): actor rank 0 broadcasts every bucket with
  RLinf's ``Worker.broadcast``.
"""

from __future__ import annotations

import shutil

import pytest
import ray
from trainer_helpers import kill_group, make_cfg, model_path

pytestmark = pytest.mark.timeout(600)
BUCKET = 64 << 10


def launch_pair(cfg, rollout_cfg, cluster):
    from rlinf_ext.config.placement import component_ranks
    from rlinf_ext.runner.groups import cpu_strategy, wait_or_raise
    from rlinf_ext.workers.actor import ActorWorker
    from rlinf_ext.workers.rollout_hf import HFRolloutWorker

    placement = component_ranks(cfg.cluster.component_placement, None)
    actor = ActorWorker.create_group(cfg, 1).launch(
        cluster, placement_strategy=cpu_strategy(2), name=cfg.actor.group_name
    )
    rollout = HFRolloutWorker.create_group(rollout_cfg).launch(
        cluster, placement_strategy=cpu_strategy(2), name=cfg.rollout.group_name
    )
    handles = [(actor.init_worker(), "actor"), (rollout.init_worker(), "rollout")]
    for handle, name in handles:
        wait_or_raise(handle, name, "init_worker", startup=True)
    return actor, rollout, placement


def sync(actor, rollout, routes):
    from rlinf_ext.runner.groups import wait_all_or_raise, wait_or_raise

    wait_or_raise(actor.set_weight_sync(routes, BUCKET), "actor", "set_weight_sync")
    wait_or_raise(rollout.set_weight_sync(routes), "rollout", "set_weight_sync")
    sent, _ = wait_all_or_raise(
        [
            (actor.sync_model_to_rollout(True), "actor", "sync_model_to_rollout"),
            (rollout.sync_model_from_actor(), "rollout", "sync_model_from_actor"),
        ]
    )
    return sent, rollout.get_state().wait()


@pytest.fixture
def randomized_model_dir(tiny_assets, tmp_path, randomized_qwen2):
    """The actor's model with every weight randomised: what the rollout engines start from."""
    out = tmp_path / "randomized"
    shutil.copytree(model_path(tiny_assets), out)
    randomized_qwen2(model_path(tiny_assets), seed=3).save_pretrained(out)
    return out


def configs(tiny_assets, tmp_path, placement, model_dir):
    cfg = make_cfg(tiny_assets, tmp_path, "http://127.0.0.1:1", **{"cluster.component_placement": placement})
    rollout_cfg = make_cfg(
        tiny_assets,
        tmp_path,
        "http://127.0.0.1:1",
        **{"cluster.component_placement": placement, "rollout.model.model_path": str(model_dir)},
    )
    return cfg, rollout_cfg


def check(sent, states, mode):
    for rank, state in enumerate(states):
        # the engine reproduces the actor's logits and loaded every weight (HFWeightLoader.finish), from its route
        assert state["last_sync_logit_diff"] is not None and state["last_sync_logit_diff"] < 1e-4
        last = state["last_sync"]
        assert last["mode"] == mode and last["buckets"] > 3
        assert last["sources"] == ([rank] if mode == "paired" else [0])
        assert last["tensor_bytes"] == sent[0]["tensor_bytes"] > 0
    if mode == "paired":  # every rank sent, in parallel; only handles crossed the process boundary
        assert [s["buckets"] for s in sent] == [states[0]["last_sync"]["buckets"]] * 2
        assert all(s["wire_bytes"] * 50 < s["tensor_bytes"] for s in sent)
    else:  # rank 0 sent every byte to both engines, rank 1 nothing
        assert sent[1]["buckets"] == 0 and sent[0]["wire_bytes"] == 2 * sent[0]["tensor_bytes"]


@pytest.mark.slow
def test_each_engine_gets_the_actor_weights_along_its_route(tiny_assets, tmp_path, cluster, randomized_model_dir):
    """The placement decides the route (same ranks: paired; disjoint: broadcast); both routes are then run on the
    same four processes (a CPU worker does not care where the placement put it). The first sync replaces the
    engines' random weights; the second (broadcast) must deliver every weight again, intact."""
    from rlinf_ext.config.placement import component_ranks
    from rlinf_ext.sync.weight_sync import SyncRoutes, sync_mode

    assert sync_mode(*component_ranks({"actor": "0-1", "rollout": "2-3"}, None).values()) == "broadcast"
    cfg, rollout_cfg = configs(tiny_assets, tmp_path, "{actor: 0-1, rollout: 0-1, reward: 0}", randomized_model_dir)
    actor, rollout, ranks = launch_pair(cfg, rollout_cfg, cluster)
    try:
        assert rollout.get_state().wait()[0]["weight_version"] == 0  # the initial weights
        paired = SyncRoutes(sync_mode(ranks["actor"], ranks["rollout"]), 2, 2)
        assert paired.mode == "paired"
        check(*sync(actor, rollout, paired), "paired")
        check(*sync(actor, rollout, SyncRoutes("broadcast", 2, 2)), "broadcast")
    finally:
        kill_group(actor, rollout)


@pytest.mark.slow
def test_a_failed_side_is_raised_instead_of_waiting_for_its_partner(cluster):
    """wait_all_or_raise: the receiver fails while its sender would block forever; the failure comes back at once."""
    from rlinf_ext.runner.groups import WorkerCallError, wait_all_or_raise

    # num_cpus=0: both tasks start even when the workers of an earlier test still hold the cluster's CPUs
    @ray.remote(num_cpus=0)
    def blocked():
        import time

        time.sleep(3600)

    @ray.remote(num_cpus=0)
    def refuses():
        raise ValueError("SGLang refused the actor's weights")

    class Call:  # what RLinf's WorkerGroupFuncResult exposes to wait_all_or_raise
        def __init__(self, ref):
            self._remote_results = [ref]

    hung = blocked.remote()
    with pytest.raises(WorkerCallError) as info:
        wait_all_or_raise(
            [
                (Call(hung), "actor", "sync_model_to_rollout"),
                (Call(refuses.remote()), "rollout", "sync_model_from_actor"),
            ]
        )
    assert info.value.component == "rollout" and "refused the actor's weights" in str(info.value)
    ray.cancel(hung, force=True)
