"""The behaviour weight through the Megatron actor's training step (``GRPOPolicy.train_step``): the engine's log-probs
scattered like the recomputed ones, the step's regression anchors, the metrics merged over micro-batches."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.training.grpo_policy import GRPOPolicy, Sample
from rlinf_ext.training.megatron_policy import MegatronPolicy
from rlinf_ext.training.rl_math import LossConfig, behaviour_weights
from rlinf_ext.training.settings import ActorSettings
from tests.support.spawn_ranks import spawn_ranks

BEHAVIOUR_NAMES = {mk.actor_name(k) for k in mk.ACTOR_BEHAVIOUR_METRICS}


@pytest.fixture(scope="module")
def tiny_model(tiny_assets):
    return tiny_assets.qwen2_tiny


def _policy(model, mode: str) -> MegatronPolicy:
    loss = LossConfig(ratio_clip_eps=0.2, kl_beta=0.1, entropy_bonus=0.01, behaviour_weight=mode)
    return MegatronPolicy(
        model,
        ActorSettings(
            group_size=2, n_minibatches=2, micro_batch_size=1, lr=1e-3, weight_decay=0.0, loss=loss, total_train_steps=2
        ),
    )


def _with_behaviour(samples, offset: float | None, seed: int = 7):
    """Copies of recomputed samples with engine log-probs: ``old + offset * noise`` on sampled tokens and 0.0 on
    observation tokens (as the agent loop writes them); ``offset=None``: no engine log-probs."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in samples:
        behav = None
        if offset is not None:
            noise = torch.randn(len(s.response_ids), generator=g)
            behav = torch.where(torch.tensor(s.response_mask, dtype=torch.bool), s.old_logprobs + offset * noise, 0.0)
        out.append(dataclasses.replace(s, behaviour_logprobs=behav))
    return out


def _train(model, mode, samples):
    policy = _policy(model, mode)
    metrics = policy.train_step(samples, step=0)
    return metrics, policy.megatron_state_dict()


@pytest.mark.slow  # three policies, three steps: 1 to 9 s on 2 shared cores
@pytest.mark.timeout(120)
def test_mode_none_and_behaviour_equal_to_proximal_train_as_today(tiny_model, actor_samples):
    """Regression anchors: with ``behaviour_weight: none`` the engine's log-probs change nothing, and with the engine
    agreeing with the recompute (pi_behav = pi_prox) truncation changes nothing but the added metrics: identical
    metrics and identical weights after two optimizer steps (n_minibatches=2, two micro-batches each)."""
    policy = _policy(tiny_model, "none")
    samples = actor_samples(policy.model.hf_vocab_size)
    policy.recompute(samples, compute_ref=True)

    today = policy.train_step(_with_behaviour(samples, None), step=0)
    today_w = policy.megatron_state_dict()
    none_m, none_w = _train(tiny_model, "none", _with_behaviour(samples, 0.5))
    equal_m, equal_w = _train(tiny_model, "truncate", _with_behaviour(samples, 0.0))

    assert none_m == today
    assert [{k: v for k, v in m.items() if k not in BEHAVIOUR_NAMES} for m in equal_m] == today
    assert all(m[mk.actor_name(mk.ACTOR_BEHAVIOUR_WEIGHT_MEAN)] == 1.0 for m in equal_m)
    for k, v in today_w.items():
        assert torch.equal(none_w[k], v) and torch.equal(equal_w[k], v), k


@pytest.mark.timeout(120)
def test_truncated_step_metrics_are_the_minibatch_token_means(tiny_model, actor_samples):
    policy = _policy(tiny_model, "truncate")
    samples = actor_samples(policy.model.hf_vocab_size)
    policy.recompute(samples, compute_ref=True)
    samples = _with_behaviour(samples, 1.0)
    metrics = policy.train_step(samples, step=0)
    for m, part in zip(metrics, (samples[:2], samples[2:])):  # no shuffling: mini-batch m = samples 2m, 2m+1
        prox = torch.cat([s.old_logprobs for s in part])[None]
        behav = torch.cat([s.behaviour_logprobs for s in part])[None]
        mask = torch.tensor([x for s in part for x in s.response_mask])[None]
        _, expected = behaviour_weights(prox, behav, mask, "truncate", cap=2.0, floor=0.5)
        assert 0 < expected["behaviour_weight_clip_fraction"] < 1  # the noise truncates some tokens, not all
        for key, value in expected.items():
            assert m[key] == pytest.approx(value, abs=1e-6), key


@pytest.mark.timeout(120)
def test_a_step_with_some_engine_logprobs_missing_is_refused(tiny_model, actor_samples):
    policy = _policy(tiny_model, "truncate")
    samples = actor_samples(policy.model.hf_vocab_size)
    policy.recompute(samples, compute_ref=True)
    samples = _with_behaviour(samples, 0.1)
    samples[3].behaviour_logprobs = None
    with pytest.raises(ValueError, match="1 of the step's 4 trajectories have no engine log-probs"):
        policy.train_step(samples, step=0)
    samples[3].behaviour_logprobs = torch.zeros(2)
    with pytest.raises(ValueError, match="must line up"):
        policy.train_step(samples, step=0)
    # asynchronous (runner.max_staleness > 0): none at all is refused too, instead of training uncorrected
    without = _with_behaviour(samples, None)
    policy.settings.behaviour_required = True
    with pytest.raises(ValueError, match="rollout.return_logprobs=true"):
        policy.train_step(without, step=0)
    policy.settings.loss = dataclasses.replace(policy.settings.loss, behaviour_weight="none")
    policy.settings.behaviour_required = False
    assert policy.optimizer_steps == 0
    policy.train_step(without, step=0)
    assert policy.optimizer_steps == 2


def _named(samples):
    """The samples with the names ``samples_of`` gives them (the result's uid, then the trajectory's index)."""
    for i, s in enumerate(samples):
        s.uid = f"s0-{i:04d}-q{i}#0"
    return samples


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_a_non_finite_engine_logprob_on_a_sampled_token_is_refused_with_its_uid(tiny_model, actor_samples, bad):
    """A NaN would make the loss NaN (clamp(nan) = nan) and a -inf would give the token the cap's weight, silently:
    the step is refused before any update, naming the trajectory and the token."""
    policy = _policy(tiny_model, "truncate")
    samples = actor_samples(policy.model.hf_vocab_size)
    policy.recompute(samples, compute_ref=True)
    samples = _named(_with_behaviour(samples, 0.1))
    samples[2].behaviour_logprobs[4] = bad  # response token 4: sampled (the observation is at 2-3)
    with pytest.raises(ValueError, match=r"trajectory s0-0002-q2#0 .* response token 4 "):
        policy.train_step(samples, step=0)
    assert policy.optimizer_steps == 0


@pytest.mark.timeout(120)
def test_a_non_finite_value_on_an_observation_token_changes_nothing(tiny_model, actor_samples):
    """Off the loss tokens the engine gave no log-prob (the agent loop writes 0.0 there) and the loss never reads
    the value (``behaviour_weights`` keeps 0 there): the step trains exactly as with 0.0."""
    policy = _policy(tiny_model, "truncate")
    samples = actor_samples(policy.model.hf_vocab_size)
    policy.recompute(samples, compute_ref=True)
    samples = _named(_with_behaviour(samples, 0.1))
    nan = [dataclasses.replace(s, behaviour_logprobs=s.behaviour_logprobs.clone()) for s in samples]
    nan[1].behaviour_logprobs[2] = float("nan")  # response token 2: an observation (mask 0)
    zero_m, zero_w = _train(tiny_model, "truncate", samples)
    nan_m, nan_w = _train(tiny_model, "truncate", nan)
    assert nan_m == zero_m
    assert all(torch.equal(nan_w[k], v) for k, v in zero_w.items())


def _refusing_rank(rank: int, port: int, out_dir: str) -> None:
    """One of two gloo ranks checking its share: rank 1's trajectory has a NaN engine log-prob on a sampled token."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    from tests.support.gloo_dp import init_gloo_dp

    policy = GRPOPolicy()  # the check reads only what every backend provides: settings, dp, device
    policy.settings, policy.dp, policy.device = ActorSettings(group_size=2), init_gloo_dp(), "cpu"
    behav = torch.tensor([-0.5, float("nan") if rank == 1 else -0.5])
    samples = [Sample([1], [2, 3], [1, 1], behaviour_logprobs=behav, uid=f"r{rank}#0")]
    try:
        policy.uses_behaviour(samples, global_size=2)
        message = "accepted"
    except ValueError as exc:
        message = str(exc)
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(message)


@pytest.mark.slow  # two gloo ranks: ~13 s in CI
@pytest.mark.timeout(120)
def test_every_data_parallel_rank_refuses_a_non_finite_engine_logprob_together(tmp_path):
    """A rank raising alone would leave the other waiting in the step's next collective: both refuse, the rank
    holding the trajectory names it."""
    from rlinf_ext.models.cpu_shims import free_port

    spawn_ranks(_refusing_rank, args=(free_port(), str(tmp_path)), nprocs=2)
    mine, theirs = ((tmp_path / f"rank{r}.txt").read_text() for r in (1, 0))
    assert mine.startswith("trajectory r1#0 has a non-finite engine log-prob (nan) at response token 1")
    assert theirs.startswith("1 other data-parallel rank(s) hold a trajectory with a non-finite engine log-prob")
