"""PPO's Megatron-core critic on CPU: the policy's backbone with a value head, values read at the token before each
response token, GAE over multi-turn samples, a value update that moves the values towards the returns, the policy
loss reading per-token advantages, and a checkpoint round trip."""

import math

import pytest
import torch

from rlinf_ext.models.megatron import hidden_states_only
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.training.critic import MegatronCritic, assign_gae
from rlinf_ext.training.data_parallel import DataParallel
from rlinf_ext.training.megatron_policy import MegatronPolicy
from rlinf_ext.training.rl_math import LossConfig
from rlinf_ext.training.settings import ActorSettings, CriticSettings


@pytest.fixture(scope="module")
def tiny_model(tiny_assets):
    return tiny_assets.qwen2_tiny


def _critic_settings(model, **kw):
    train = ActorSettings(
        group_size=2,
        n_minibatches=2,
        micro_batch_size=1,
        logprob_micro_batch_size=2,
        adv_type="gae",
        loss=LossConfig(),
        lr=1e-2,
        weight_decay=0.0,
        clip_grad=1.0,
        total_train_steps=3,
    )
    return CriticSettings(train=train, model_path=str(model), **kw)


@pytest.mark.slow  # a Megatron policy and its critic built, stepped and saved: ~14 s on 2 cores
@pytest.mark.timeout(120)
def test_critic_values_gae_update_and_checkpoint(tiny_model, tmp_path, actor_samples):
    settings = _critic_settings(tiny_model, value_clip=10.0)
    policy = MegatronPolicy(tiny_model, settings.train)
    critic = MegatronCritic(settings)
    # the backbone is the policy's: same decoder weights; the vocabulary projection is frozen, the head trains
    pol, cri = policy.megatron_state_dict(), critic.megatron_state_dict()
    assert all(torch.equal(pol[k], cri[k]) for k in pol)
    assert set(cri) - set(pol) == {"value_head.weight", "value_head.bias"}
    trainable = {n for n, p in critic.model.named_parameters() if p.requires_grad}
    assert "value_head.weight" in trainable and not any(n.startswith("output_layer") for n in trainable)

    samples = actor_samples(policy.model.hf_vocab_size)
    values = critic.compute_values(samples)
    assert [len(v) for v in values] == [len(s.response_ids) for s in samples]
    # response token j's value is the head on the hidden state of the token before it (the last prompt token for j=0)
    s0 = samples[0]
    ids = torch.tensor([s0.prompt_ids + s0.response_ids])
    with torch.no_grad(), hidden_states_only(critic.model):
        hidden = critic.model(
            ids, torch.arange(ids.shape[1])[None], critic._inputs(critic.model, critic._pack([s0]))[2]
        )
    direct = critic.model.value_head(hidden).squeeze(-1)[:, 0]
    p = len(s0.prompt_ids)
    assert torch.allclose(values[0], direct[p - 1 : p - 1 + len(s0.response_ids)], atol=1e-6)

    for smp, v in zip(samples, values):
        smp.values = v
    step_metrics = assign_gae(samples, settings, DataParallel.from_parallel_state())
    for smp in samples:
        mask = torch.tensor(smp.response_mask, dtype=torch.bool)
        # gamma = lambda = 1: returns are the reward on every generated token, 0 on the observation
        assert torch.allclose(smp.returns[mask], torch.full((int(mask.sum()),), smp.reward))
        assert torch.all(smp.returns[~mask] == 0) and torch.all(smp.advantages[~mask] == 0)
    picked = torch.cat([s.advantages[torch.tensor(s.response_mask, dtype=torch.bool)] for s in samples])
    assert abs(float(picked.mean())) < 1e-5 and float(picked.std()) == pytest.approx(1.0, abs=1e-4)
    assert set(step_metrics) == {mk.CRITIC_VF_EXPLAINED_VAR, mk.CRITIC_VALUES_MEAN}

    def loss_now():
        fresh = critic.compute_values(samples)
        return sum(
            float(((f - s.returns)[torch.tensor(s.response_mask, dtype=torch.bool)] ** 2).sum())
            for f, s in zip(fresh, samples)
        )

    before = loss_now()
    layout_mbs = policy.minibatches(_layout(len(samples)), step=0)
    for _ in range(3):
        metrics = critic.train_values(samples, layout_mbs)
    assert len(metrics) == 2 and all(math.isfinite(m[mk.CRITIC_VALUE_LOSS]) for m in metrics)
    assert {mk.CRITIC_VALUE_LOSS, mk.CRITIC_VALUE_CLIP_FRAC} <= set(metrics[0])
    assert loss_now() < before  # the values moved towards the returns

    # the policy reads the per-token advantages (a trajectory without them is refused)
    policy.recompute(samples, compute_ref=False)
    actor = policy.train_step(samples, step=0)
    assert all(math.isfinite(m["loss"]) for m in actor)
    samples[1].advantages = None
    with pytest.raises(ValueError, match="per-token advantages"):
        policy.train_step(samples, step=1)

    # save -> fresh critic -> load: the same weights (head included) and optimizer position
    critic.save(tmp_path / "critic", iteration=1)
    other = MegatronCritic(settings)
    assert other.load(tmp_path / "critic") == 1
    assert other.optimizer_steps == critic.optimizer_steps == 6
    assert all(torch.equal(v, other.megatron_state_dict()[k]) for k, v in critic.megatron_state_dict().items())


def _layout(n):
    from rlinf_ext.training.data_parallel import ShardLayout

    return ShardLayout(tuple(range(n)), n)
