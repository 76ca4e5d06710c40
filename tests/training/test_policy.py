"""Megatron-core actor: gradient check against transformers, logprob recompute, training step, checkpoints."""

import math

import pytest
import torch

from rlinf_ext.training.batching import gather_logprobs, pack_sequences, response_scatter
from rlinf_ext.training.grpo_policy import Sample
from rlinf_ext.training.megatron_policy import MegatronPolicy
from rlinf_ext.training.rl_math import LossConfig, grpo_actor_loss
from rlinf_ext.training.settings import ActorSettings

# fp32 on CPU; Megatron and HF differ only in summation order.
LOGPROB_ATOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6


@pytest.fixture(scope="module")
def tiny_model(tiny_assets):
    return tiny_assets.qwen2_tiny


def _settings(**kw):
    base = dict(
        group_size=2,
        n_minibatches=2,
        micro_batch_size=1,
        logprob_micro_batch_size=2,
        loss=LossConfig(ratio_clip_eps=0.2, kl_beta=0.1, entropy_bonus=0.01),
        lr=1e-3,
        weight_decay=0.0,
        clip_grad=1.0,
        total_train_steps=3,
    )
    base.update(kw)
    return ActorSettings(**base)


@pytest.mark.timeout(120)
def test_megatron_loss_and_grads_match_transformers(tiny_model, actor_samples):
    from transformers import AutoModelForCausalLM

    from rlinf_ext.convert.state_dicts import megatron_to_hf

    policy = MegatronPolicy(tiny_model, _settings())
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="eager")
    vocab = hf.config.vocab_size
    samples = actor_samples(vocab)
    batch = pack_sequences(
        [s.prompt_ids for s in samples], [s.response_ids for s in samples], [s.response_mask for s in samples], 0
    )
    # logprobs of exactly the trajectory ids
    mg_lp = policy.compute_logprobs(samples)
    with torch.no_grad():
        hf_logits = hf(input_ids=batch.input_ids, attention_mask=(batch.input_ids != -1).long()).logits
    hf_all = gather_logprobs(hf_logits, batch.input_ids)
    for i, s in enumerate(samples):
        p = len(s.prompt_ids)
        assert torch.allclose(mg_lp[i], hf_all[i, p - 1 : p - 1 + len(s.response_ids)], atol=LOGPROB_ATOL)

    # same loss, same gradients (mapped to HF names)
    g = torch.Generator().manual_seed(1)
    for s, lp in zip(samples, mg_lp):
        s.old_logprobs = lp + 0.05 * torch.randn(lp.shape, generator=g)
        s.ref_logprobs = lp + 0.05 * torch.randn(lp.shape, generator=g)
    adv = torch.tensor([0.7, -0.7, 1.0, -1.0])
    num_tokens = float(batch.loss_mask.sum())
    policy.step.zero_grad()
    mg_loss, _ = policy._micro_loss(samples, adv, num_tokens)
    mg_loss.backward()

    logits = hf(input_ids=batch.input_ids).logits
    lp = gather_logprobs(logits, batch.input_ids)
    old = response_scatter(torch.nn.utils.rnn.pad_sequence([s.old_logprobs for s in samples], batch_first=True), batch)
    ref = response_scatter(torch.nn.utils.rnn.pad_sequence([s.ref_logprobs for s in samples], batch_first=True), batch)
    from reference_logprobs import entropy_from_logits

    hf_loss, _ = grpo_actor_loss(
        lp,
        old,
        adv[:, None] * batch.loss_mask,
        batch.loss_mask,
        policy.settings.loss,
        ref_logprobs=ref,
        entropy=entropy_from_logits(logits[:, :-1]),
        num_tokens=num_tokens,
    )
    hf_loss.backward()
    assert math.isfinite(mg_loss.item())
    assert mg_loss.item() == pytest.approx(hf_loss.item(), abs=1e-5)

    mg_grads = policy.gradients()  # Megatron's DDP accumulated them into its fp32 buffer
    mapped = megatron_to_hf({(0, 0): mg_grads}, policy.spec)
    hf_grads = dict(hf.named_parameters())
    compared = 0
    for name, grad in mapped.items():
        ref_grad = hf_grads[name].grad
        assert torch.allclose(grad, ref_grad, rtol=GRAD_RTOL, atol=GRAD_ATOL), name
        compared += 1
    assert compared >= 10 and any(g.abs().sum() > 0 for g in mapped.values())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_train_step_changes_params_and_logprobs_and_checkpoint_roundtrip(tiny_model, tmp_path, actor_samples):
    policy = MegatronPolicy(tiny_model, _settings(lr_warmup_fraction=0.5, lr_decay_style="linear"))
    samples = actor_samples(policy.model.hf_vocab_size)
    policy.recompute(samples, compute_ref=True)
    before = {k: v.clone() for k, v in policy.megatron_state_dict().items()}
    assert all(torch.equal(s.old_logprobs, s.ref_logprobs) for s in samples)  # same weights at start

    metrics = policy.train_step(samples, step=0)
    assert len(metrics) == 2  # n_minibatches optimizer steps
    for m in metrics:
        assert math.isfinite(m["loss"]) and m["update_success"] == 1.0
    assert metrics[0]["lr"] < metrics[1]["lr"]  # warmup
    after = policy.megatron_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    new_lp = policy.compute_logprobs(samples)
    assert any(not torch.allclose(a, s.old_logprobs) for a, s in zip(new_lp, samples))
    # the reference stays frozen
    ref_again = policy.compute_logprobs(samples, reference=True)
    assert all(torch.equal(a, s.ref_logprobs) for a, s in zip(ref_again, samples))

    # save (Megatron's layout) -> fresh policy -> load: identical weights, optimizer, RNG and next step
    rank_file = policy.save(tmp_path / "actor", iteration=1)
    assert rank_file == tmp_path / "actor" / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt"
    assert (tmp_path / "actor" / "latest_checkpointed_iteration.txt").read_text() == "1"
    rng_after_save = torch.rand(3)  # the RNG stream right after the save ...
    other = MegatronPolicy(tiny_model, _settings(lr_warmup_fraction=0.5, lr_decay_style="linear"))
    assert other.load(tmp_path / "actor") == 1
    assert torch.equal(torch.rand(3), rng_after_save)  # ... continues after the load
    assert other.optimizer_steps == policy.optimizer_steps == 2
    assert all(torch.equal(v, other.megatron_state_dict()[k]) for k, v in policy.megatron_state_dict().items())
    assert other.optimizer.state_dict()["state"].keys() == policy.optimizer.state_dict()["state"].keys()
    policy.recompute(samples, True)
    samples2 = [Sample(s.prompt_ids, s.response_ids, s.response_mask, s.reward) for s in samples]
    other.recompute(samples2, True)
    m1 = policy.train_step(samples, step=1)
    m2 = other.train_step(samples2, step=1)
    assert m1[-1]["loss"] == pytest.approx(m2[-1]["loss"], abs=1e-7)
    assert all(torch.equal(v, other.megatron_state_dict()[k]) for k, v in policy.megatron_state_dict().items())


def test_hf_state_dict_roundtrip_names(tiny_model):
    from safetensors.torch import load_file

    policy = MegatronPolicy(tiny_model, _settings(loss=LossConfig()))
    hf_sd = policy.hf_state_dict()
    orig = load_file(str(next(tiny_model.glob("*.safetensors"))))
    for k, v in hf_sd.items():
        assert torch.equal(v, orig[k]), k


@pytest.mark.timeout(120)
def test_one_step_moves_logprobs_towards_rewarded_trajectories(tiny_model, actor_samples):
    """The sign of the whole GRPO chain (advantages, loss, optimizer step): after one small step the rewarded
    trajectory of each group is more likely and the unrewarded one less, relative to each other."""
    policy = MegatronPolicy(
        tiny_model, _settings(n_minibatches=1, micro_batch_size=2, lr=1e-4, loss=LossConfig(ratio_clip_eps=0.2))
    )
    samples = actor_samples(500, n=8, seed=3)  # rewards 0,1,0,1,...: each group of 2 has one success
    policy.recompute(samples, compute_ref=False)
    before = [lp.clone() for lp in policy.compute_logprobs(samples)]
    policy.train_step(samples, 0)
    after = policy.compute_logprobs(samples)

    def gain(i):  # mean log-prob change over the policy's own tokens
        m = torch.tensor(samples[i].response_mask, dtype=torch.bool)
        return float((after[i] - before[i])[m].mean())

    margins = [gain(i + 1) - gain(i) for i in range(0, len(samples), 2)]  # rewarded minus unrewarded, per group
    assert all(m > 0 for m in margins), margins


def test_sampling_temperature_reading():
    from types import SimpleNamespace as NS

    from rlinf_ext.training.settings import sampling_temperature

    assert sampling_temperature(NS(do_sample=True, temperature=0.7)) == 0.7
    assert sampling_temperature(NS(do_sample=False, temperature=0.7)) == 1.0  # greedy: untempered
    assert sampling_temperature(NS(do_sample=True, temperature=0.0)) == 1.0


@pytest.mark.timeout(120)
def test_logprobs_are_those_of_the_tempered_sampling_distribution(tiny_model, actor_samples):
    """With rollout temperature T the actor's log-probs are log_softmax(logits / T), as RLinf computes them."""
    from transformers import AutoModelForCausalLM

    policy = MegatronPolicy(tiny_model, _settings(temperature=0.5))
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="eager")
    samples = actor_samples(hf.config.vocab_size)
    batch = pack_sequences(
        [s.prompt_ids for s in samples], [s.response_ids for s in samples], [s.response_mask for s in samples], 0
    )
    with torch.no_grad():
        hf_logits = hf(input_ids=batch.input_ids, attention_mask=(batch.input_ids != -1).long()).logits
    tempered, plain = gather_logprobs(hf_logits / 0.5, batch.input_ids), gather_logprobs(hf_logits, batch.input_ids)
    for i, (s, lp) in enumerate(zip(samples, policy.compute_logprobs(samples))):
        p, n = len(s.prompt_ids), len(s.response_ids)
        assert torch.allclose(lp, tempered[i, p - 1 : p - 1 + n], atol=LOGPROB_ATOL)
        assert not torch.allclose(lp, plain[i, p - 1 : p - 1 + n], atol=1e-3)
