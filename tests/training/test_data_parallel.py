"""Data-parallel Megatron-core actor (training/data_parallel.py) on CPU with gloo and real Megatron-core.

Two processes (torch.multiprocessing spawn) train on halves of the same GRPO groups that one process trains on
whole; the weights must agree up to float summation order. Two scenarios: (a) groups interleaved over the
ranks, rollout shuffled, 2 mini-batches; (b) each rank holds one whole mini-batch and nothing of the other
(a rank with no sample still joins the token count and the gradient sum). The gradients go through Megatron's
DistributedDataParallel (summed, not averaged); Adam's state is sharded with ZeroRedundancyOptimizer in the first
scenario and whole in the second. The samples carry engine log-probs: the first scenario weights its loss by them
(decoupled PPO, truncated; the behaviour metrics merged over the ranks), the second ignores them. The DP2-vs-DP1
difference is ~1e-7 against weight changes of ~6e-3; checked by hand when this file was written: with DDP's default
mean instead of the sum (calculate_per_token_loss=False) it is 1.3e-3 (0.24x the weight change), with per-rank
instead of global token counts 2.0e-3 (0.38x): the tests fail.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.training.data_parallel import DataParallel, DataParallelError, ShardLayout, shard_layout, share_of
from rlinf_ext.training.grpo_policy import Sample
from rlinf_ext.training.megatron_policy import MegatronPolicy
from rlinf_ext.training.rl_math import LossConfig
from rlinf_ext.training.settings import ActorSettings
from tests.support.spawn_ranks import spawn_ranks

GROUP = 2
STEPS = 2  # rollout steps (each = 2 optimizer steps): the second one runs on Adam moments built with DP
# fp32 on CPU: the two runs differ only in summation order (gradient sum over ranks, micro-batch order).
# Tolerance relative to the largest weight change of the run (~ lr * steps): 1e-4 of it.
REL_TOL = 1e-4

LOSS = LossConfig(ratio_clip_eps=0.2, kl_beta=0.05, entropy_bonus=0.01, behaviour_weight="truncate")
SCENARIOS = {
    # name: (settings overrides, groups of rank 0, groups of rank 1) -- rank lists deliberately unsorted;
    # the first shards Adam's state over the ranks (ZeroRedundancyOptimizer), the second keeps it whole; the samples
    # carry engine log-probs: the first weights the loss by them (decoupled PPO, truncated), the second ignores them
    "interleaved_shuffled": ({"shuffle_rollout": True}, ["g3", "g0"], ["g2", "g1"]),
    "one_minibatch_per_rank": (
        {
            "shuffle_rollout": False,
            "use_distributed_optimizer": False,
            "loss": dataclasses.replace(LOSS, behaviour_weight="none"),
        },
        ["g0", "g1"],
        ["g3", "g2"],
    ),
}
OPTIMIZER = {"interleaved_shuffled": "ZeroRedundancyOptimizer", "one_minibatch_per_rank": "AdamW"}


def _settings(**kw) -> ActorSettings:
    base = dict(
        group_size=GROUP,
        n_minibatches=2,
        micro_batch_size=1,
        logprob_micro_batch_size=2,
        loss=LOSS,
        lr=2e-3,
        weight_decay=0.01,
        clip_grad=1.0,
        total_train_steps=STEPS,
        seed=7,
    )
    base.update(kw)
    return ActorSettings(**base)


def _groups(vocab: int) -> dict[str, list[Sample]]:
    """4 GRPO groups of 2 trajectories; different lengths and observation masks so token counts differ per rank,
    old/reference log-probs that are not the policy's (ratios != 1, KL != 0) and engine log-probs that are not
    the old ones (behaviour weights != 1, some above the cap; 0.0 on observation tokens)."""
    g = torch.Generator().manual_seed(11)
    groups = {}
    for k in range(4):
        samples = []
        for j in range(GROUP):
            p = torch.randint(3, vocab, (3 + k,), generator=g).tolist()
            r = torch.randint(3, vocab, (4 + 3 * k + 2 * j,), generator=g).tolist()
            m = [1] * len(r)
            m[1 : 1 + k] = [0] * k  # observations of varying length
            old = -2.0 - 0.1 * torch.rand(len(r), generator=g)
            sampled = torch.tensor(m, dtype=torch.bool)
            behaviour = torch.where(sampled, old - 0.5 * torch.randn(len(r), generator=g), 0.0)
            samples.append(
                Sample(
                    p,
                    r,
                    m,
                    reward=float((k + j) % 2) + 0.25 * k,
                    old_logprobs=old,
                    ref_logprobs=-2.0 - 0.1 * torch.rand(len(r), generator=g),
                    behaviour_logprobs=behaviour,
                )
            )
        groups[f"g{k}"] = samples
    return groups


def _train(model_dir: str, settings: ActorSettings, uids: list[str] | None):
    """Train STEPS rollout steps on this rank's groups (all of them when ``uids`` is None), as the worker does:
    local results sorted by uid, the global layout agreed with the other ranks."""
    policy = MegatronPolicy(model_dir, settings)
    groups = _groups(policy.model.hf_vocab_size)
    local = sorted(groups if uids is None else uids)
    samples = [s for uid in local for s in groups[uid]]
    layout = shard_layout(local, [len(groups[u]) for u in local], policy.dp)
    metrics = [policy.train_step(samples, step, layout) for step in range(STEPS)]
    return policy, metrics


def _dp_rank(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    from rlinf_ext.models.cpu_shims import destroy_parallel_state, init_parallel_state

    torch.set_num_threads(1)
    setup = init_parallel_state(1, 1, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}", seed=7)
    try:
        from megatron.core import parallel_state

        results = {
            "dp_world_size": parallel_state.get_data_parallel_world_size(),
            "dp_rank": parallel_state.get_data_parallel_rank(),
        }
        policies = {}
        for name, (overrides, rank0, rank1) in SCENARIOS.items():
            policies[name], metrics = _train(model_dir, _settings(**overrides), (rank0, rank1)[rank])
            results[name] = {
                "state": policies[name].megatron_state_dict(),
                "metrics": metrics,
                "optimizer": type(policies[name].optimizer).__name__,
            }
        # checkpoint of the sharded (ZeRO) optimizer: every rank calls save (RNG states and Adam shards gathered),
        # rank 0 writes, every rank loads its part back
        policy, settings = policies["interleaved_shuffled"], _settings(**SCENARIOS["interleaved_shuffled"][0])
        ckpt = os.path.join(out_dir, "ckpt")
        written = policy.save(ckpt, iteration=STEPS)
        results["wrote_checkpoint"] = written is not None
        torch.distributed.barrier()
        other = MegatronPolicy(model_dir, settings)
        other.load(ckpt)
        results["loaded_equal"] = all(
            torch.equal(v, other.megatron_state_dict()[k]) for k, v in policy.megatron_state_dict().items()
        )
        mine, theirs = policy.step.state_dict(), other.step.state_dict()  # consolidated on rank 0 (collective)
        if rank == 0:
            results["optimizer_equal"] = mine["param_groups"] == theirs["param_groups"] and all(
                torch.equal(mine["state"][i][k], theirs["state"][i][k]) for i in mine["state"] for k in mine["state"][i]
            )
        results["rng_states"] = len(torch.load(written, weights_only=False)["rng_state"]) if written else None
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        destroy_parallel_state(setup)


@pytest.fixture(scope="module")
def dp2_results(tiny_assets, tmp_path_factory):
    from rlinf_ext.models.cpu_shims import free_port

    out = tmp_path_factory.mktemp("dp2")
    spawn_ranks(_dp_rank, args=(2, free_port(), str(tiny_assets.qwen2_tiny), str(out)), nprocs=2)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def dp1_results(tiny_assets):
    """The same steps in this process, one rank on all groups (no process group of size > 1 here)."""
    initial = MegatronPolicy(str(tiny_assets.qwen2_tiny), _settings()).megatron_state_dict()
    out = {"initial": initial}
    for name, (overrides, _, _) in SCENARIOS.items():
        policy, metrics = _train(str(tiny_assets.qwen2_tiny), _settings(**overrides), None)
        assert policy.dp.size == 1
        out[name] = {"state": policy.megatron_state_dict(), "metrics": metrics}
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_two_ranks_give_the_update_of_one_rank_on_the_whole_batch(dp1_results, dp2_results, scenario):
    ref, initial = dp1_results[scenario]["state"], dp1_results["initial"]
    step_size = max(float((ref[k] - initial[k]).abs().max()) for k in ref)
    assert step_size > 1e-4  # the run did move the weights
    worst = max(float((dp2_results[0][scenario]["state"][k] - ref[k]).abs().max()) for k in ref)
    print(f"{scenario}: largest weight change {step_size:.3e}, largest DP2-vs-DP1 difference {worst:.3e}")
    assert worst <= REL_TOL * step_size, (worst, step_size)
    assert dp2_results[0][scenario]["optimizer"] == OPTIMIZER[scenario]
    # both ranks end with identical weights (bit for bit: the summed gradients are the same on every rank)
    for k, v in dp2_results[0][scenario]["state"].items():
        assert torch.equal(v, dp2_results[1][scenario]["state"][k]), k
    # metrics are global and the same on both ranks
    for m1, m2a, m2b in zip(
        dp1_results[scenario]["metrics"], dp2_results[0][scenario]["metrics"], dp2_results[1][scenario]["metrics"]
    ):
        for a, b, c in zip(m1, m2a, m2b):
            assert a.keys() == b.keys() == c.keys()
            assert b == c
            assert b["num_tokens"] == a["num_tokens"]
            assert all(
                (mk.actor_name(key) in a) == (scenario == "interleaved_shuffled") for key in mk.ACTOR_BEHAVIOUR_METRICS
            )
            for key in (
                "loss",
                "policy_loss",
                "kl",
                "entropy",
                "grad_norm",
                "lr",
                "advantages_mean",
                "advantages_max",
                "advantages_min",
                "clip_fraction",
                *(mk.actor_name(k) for k in mk.ACTOR_BEHAVIOUR_METRICS),
            ):
                if key in a:
                    assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-6), (key, a[key], b[key])


@pytest.mark.slow
def test_dp2_process_group_and_checkpoint(dp2_results):
    for rank, res in enumerate(dp2_results):
        assert (res["dp_world_size"], res["dp_rank"]) == (2, rank)
        assert res["loaded_equal"]  # load_checkpoint restores the same weights on every rank
    assert [r["wrote_checkpoint"] for r in dp2_results] == [True, False]  # rank 0 writes
    assert dp2_results[0]["optimizer_equal"]  # the sharded Adam state went through the file and back
    assert dp2_results[0]["rng_states"] == 2  # one RNG state per data-parallel rank, as Megatron


def test_share_of_refuses_a_batch_the_ranks_cannot_share_and_names_the_fix():
    assert share_of(8, DataParallel(size=2)) == 4 and share_of(3, DataParallel()) == 3
    with pytest.raises(DataParallelError) as info:
        share_of(6, DataParallel(size=4))
    text = str(info.value)
    assert "4 data-parallel processes" in text and "data.rollout_batch_size a multiple of 4" in text
    assert "e.g. 8" in text and "cluster.component_placement" in text


def test_shard_layout_of_a_single_rank_is_the_identity():
    layout = shard_layout(["a", "b"], [2, 3], DataParallel())
    assert layout == ShardLayout((0, 1, 2, 3, 4), 5)
