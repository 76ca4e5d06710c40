"""Mixed precision of the Megatron-core actor on CPU (CPU autocast): fp32 master weights keep 1e-6 updates
that bf16 weights would round away, fp16 goes through a dynamic/static loss scaler, weights are sent to the
rollout in its dtype. The fp32 path is covered unchanged by test_actor.py (gradients equal HF's)."""

from types import SimpleNamespace

import pytest
import torch

from rlinf_ext.sync.weight_sync import rollout_dtype
from rlinf_ext.training.megatron_policy import MegatronPolicy
from rlinf_ext.training.precision import MixedPrecision
from rlinf_ext.training.rl_math import LossConfig
from rlinf_ext.training.settings import ActorSettings

pytestmark = pytest.mark.timeout(300)


def _settings(**kw):
    base = dict(
        group_size=2,
        n_minibatches=1,
        micro_batch_size=2,
        logprob_micro_batch_size=2,
        loss=LossConfig(ratio_clip_eps=0.2, kl_beta=0.1),
        lr=1e-6,
        weight_decay=0.0,
        clip_grad=1.0,
        total_train_steps=4,
    )
    base.update(kw)
    return ActorSettings(**base)


def _prepared(policy, samples):
    policy.recompute(samples, compute_ref=True)
    return samples


def _weights(policy):
    return {n: p.detach().clone() for n, p in policy.model.named_parameters()}


@pytest.fixture(scope="module")
def tiny_model(tiny_assets):
    return tiny_assets.qwen2_tiny


def test_bf16_autocast_keeps_tiny_updates_in_fp32_master_weights(tiny_model, actor_samples):
    policy = MegatronPolicy(tiny_model, _settings(precision="bf16"))
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())  # the master copy
    # frozen reference: its matrices in the compute dtype (the local spec's torch norms stay fp32)
    assert all(p.dtype == torch.bfloat16 for p in policy.ref_model.parameters() if p.ndim >= 2)
    samples = _prepared(policy, actor_samples(policy.model.hf_vocab_size))
    assert all(s.old_logprobs.dtype == torch.float32 and s.ref_logprobs.dtype == torch.float32 for s in samples)
    before = _weights(policy)
    metrics = policy.train_step(samples, step=0)
    assert metrics[0]["update_success"] == 1.0 and "loss_scale" not in metrics[0]  # bf16: no loss scaling
    after = _weights(policy)
    changed = sum(int((after[n] != before[n]).sum()) for n in before)
    total = sum(t.numel() for t in before.values())
    assert changed > 0.5 * total  # Adam's first step moves (almost) every weight by ~lr = 1e-6
    # the same update applied to bf16 weights would be rounded away almost everywhere
    kept_in_bf16 = sum(int((after[n].bfloat16() != before[n].bfloat16()).sum()) for n in before)
    assert kept_in_bf16 < 0.05 * changed
    # gradients were freed after the step (memory for the rollout / next step)
    assert all(p.grad is None for p in policy.model.parameters())


def test_bf16_logprobs_are_fp32_and_close_to_fp32_policy(tiny_model, actor_samples):
    samples = actor_samples(512)
    lp32 = MegatronPolicy(tiny_model, _settings(precision="fp32")).compute_logprobs(samples)
    bf16_policy = MegatronPolicy(tiny_model, _settings(precision="bf16"))
    lp16 = bf16_policy.compute_logprobs(samples)
    ref16 = bf16_policy.compute_logprobs(samples, reference=True)
    for a, b, r in zip(lp32, lp16, ref16):
        assert b.dtype == torch.float32
        assert not torch.equal(a, b)  # autocast really ran in bf16
        assert torch.allclose(a, b, atol=0.1) and torch.allclose(a, r, atol=0.1)
    # the probe for the weight-sync check uses the fp32 master weights without autocast
    ids = torch.arange(8)[None] + 3
    fp32_probe = MegatronPolicy(tiny_model, _settings(precision="fp32")).probe_logits(ids)
    assert torch.allclose(bf16_policy.probe_logits(ids), fp32_probe, atol=1e-5)


def test_fp16_dynamic_loss_scale_skips_overflow_and_backs_off(tiny_model, actor_samples):
    policy = MegatronPolicy(tiny_model, _settings(precision="fp16"))
    assert policy.amp.scaler.is_enabled()
    samples = _prepared(policy, actor_samples(policy.model.hf_vocab_size))
    policy.amp.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**80)  # scaled fp16 gradients overflow
    before = _weights(policy)
    m = policy.train_step(samples, step=0)[0]
    assert m["update_success"] == 0.0 and m["loss_scale"] == 2.0**79  # step skipped, scale halved
    assert all(torch.equal(before[n], p) for n, p in policy.model.named_parameters())
    policy.amp.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    m = policy.train_step(samples, step=1)[0]
    assert m["update_success"] == 1.0 and m["loss_scale"] == 2.0**10
    assert any(not torch.equal(before[n], p) for n, p in policy.model.named_parameters())


def test_fp16_static_loss_scale_stays_and_is_checkpointed(tiny_model, tmp_path, actor_samples):
    policy = MegatronPolicy(tiny_model, _settings(precision="fp16", loss_scale=2.0**80))
    samples = _prepared(policy, actor_samples(policy.model.hf_vocab_size))
    m = policy.train_step(samples, step=0)[0]
    assert m["update_success"] == 0.0 and m["loss_scale"] == 2.0**80  # static: an overflow does not lower it
    policy.amp.static_scale = 512.0
    policy.amp.update()
    policy.save(tmp_path / "actor", iteration=1)
    restored = MegatronPolicy(tiny_model, _settings(precision="fp16"))
    restored.load(tmp_path / "actor")
    assert restored.amp.loss_scale() == 512.0


def test_precision_settings_and_rollout_dtype():
    assert MixedPrecision("fp32", torch.device("cpu")).autocast().__class__.__name__ == "nullcontext"
    assert not MixedPrecision("bf16", torch.device("cpu")).scaler.is_enabled()
    with pytest.raises(ValueError, match="actor.model.precision"):
        MixedPrecision("fp8", torch.device("cpu"))

    def cfg(backend, precision="bf16", hf_dtype="float32"):
        return SimpleNamespace(
            rollout=SimpleNamespace(
                rollout_backend=backend, model=SimpleNamespace(precision=precision), hf=SimpleNamespace(dtype=hf_dtype)
            )
        )

    assert rollout_dtype(cfg("sglang", "bf16")) == torch.bfloat16
    assert rollout_dtype(cfg("sglang", "fp16")) == torch.float16
    assert rollout_dtype(cfg("hf", "bf16", "float32")) == torch.float32  # the CPU engine's own dtype
    with pytest.raises(ValueError, match="rollout.model.precision"):
        rollout_dtype(cfg("sglang", "int8"))


def test_hf_state_dict_in_rollout_dtype(tiny_model):
    policy = MegatronPolicy(tiny_model, _settings(precision="bf16", loss=LossConfig()))
    full = policy.hf_state_dict()
    half = policy.hf_state_dict(dtype=torch.bfloat16)
    assert full.keys() == half.keys()
    for k, v in half.items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, full[k].bfloat16())
