"""Chunked next-token log-probs (training/logprobs.py): the values and gradients of the unchunked formula, and no
full-vocabulary tensor kept for the backward."""

import math

import pytest
import torch
from reference_logprobs import entropy_from_logits

from rlinf_ext.training.batching import gather_logprobs
from rlinf_ext.training.logprobs import next_token_logprobs

S, B, H, V = 11, 2, 8, 50


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(S, B, H, generator=g, requires_grad=True)
    weight = torch.randn(V, H, generator=g, requires_grad=True)
    ids = torch.randint(0, V, (B, S), generator=g)
    return hidden, weight, ids


def _full(hidden, weight, ids, temperature):
    """The unchunked reference: [B, S, V] logits, fp32 log_softmax, gather (batching.gather_logprobs)."""
    logits = (hidden @ weight.T).transpose(0, 1) / temperature
    return gather_logprobs(logits, ids), entropy_from_logits(logits[:, :-1])


@pytest.mark.parametrize("chunk_tokens", [1, 3, 4, 1000])
def test_chunked_values_and_gradients_equal_the_full_formula(chunk_tokens):
    hidden, weight, ids = _setup()
    lp, ent = next_token_logprobs(
        lambda h: h @ weight.T, hidden, ids, temperature=0.7, chunk_tokens=chunk_tokens, with_entropy=True
    )
    assert lp.shape == ent.shape == (B, S - 1)
    (lp.sum() + 0.3 * ent.sum()).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref_lp, ref_ent = _full(hidden, weight, ids, 0.7)
    (ref_lp.sum() + 0.3 * ref_ent.sum()).backward()
    assert torch.allclose(lp, ref_lp, atol=1e-6) and torch.allclose(ent, ref_ent, atol=1e-5)
    assert torch.allclose(grads[0], hidden.grad, atol=1e-5) and torch.allclose(grads[1], weight.grad, atol=1e-5)


def test_no_full_vocabulary_tensor_is_saved_for_the_backward():
    """Every tensor autograd keeps for the backward, by size: chunked, the largest is the hidden states (the
    checkpointed chunks keep only their inputs); unchunked, fp32 [T, V] tensors are kept."""

    def saved_sizes(fn):
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return sizes

    hidden, weight, ids = _setup()
    full_vocab = (S - 1) * B * V
    chunked = saved_sizes(lambda: next_token_logprobs(lambda h: h @ weight.T, hidden, ids, chunk_tokens=4))
    assert max(chunked) <= max(hidden.numel(), weight.numel())
    assert max(_ for _ in saved_sizes(lambda: _full(hidden, weight, ids, 1.0)[0])) >= full_vocab


def test_no_grad_runs_without_checkpointing_and_refuses_a_bad_chunk():
    hidden, weight, ids = _setup()
    with torch.no_grad():
        lp, ent = next_token_logprobs(lambda h: h @ weight.T, hidden, ids, chunk_tokens=5)
    assert ent is None and not lp.requires_grad
    assert torch.allclose(lp, _full(hidden.detach(), weight.detach(), ids, 1.0)[0], atol=1e-6)
    with pytest.raises(ValueError, match="actor.logprob_chunk_tokens"):
        next_token_logprobs(lambda h: h @ weight.T, hidden, ids, chunk_tokens=0)


@pytest.mark.timeout(120)
def test_policy_chunked_logprobs_and_gradients_do_not_depend_on_the_chunk(tiny_assets, actor_samples):
    """The real actor with 2-token chunks (every sequence split many times) gives the log-probs, loss and
    gradients of one chunk per sequence."""
    from rlinf_ext.training.megatron_policy import MegatronPolicy
    from rlinf_ext.training.rl_math import LossConfig
    from rlinf_ext.training.settings import ActorSettings

    out = []
    for chunk in (2, 4096):
        settings = ActorSettings(
            group_size=2,
            logprob_micro_batch_size=4,
            logprob_chunk_tokens=chunk,
            loss=LossConfig(kl_beta=0.1, entropy_bonus=0.01),
            temperature=0.8,
        )
        policy = MegatronPolicy(tiny_assets.qwen2_tiny, settings)
        samples = actor_samples(policy.model.hf_vocab_size)
        policy.recompute(samples, compute_ref=True)
        policy.step.zero_grad()
        loss, _ = policy._micro_loss(samples, torch.tensor([0.5, -0.5, 1.0, -1.0]), 20.0)
        loss.backward()
        out.append(([s.old_logprobs for s in samples], loss.item(), policy.gradients()))
    (lp_a, loss_a, g_a), (lp_b, loss_b, g_b) = out
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(lp_a, lp_b))
    assert loss_a == pytest.approx(loss_b, abs=1e-6)
    assert all(torch.allclose(g_a[k], g_b[k], atol=1e-6) for k in g_a) and any(g.abs().sum() > 0 for g in g_a.values())


def test_the_entropy_reference_on_uniform_and_peaked_logits():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    ent = entropy_from_logits(logits)
    assert ent[0].item() == pytest.approx(math.log(4.0), abs=1e-6)
    assert ent[1].item() == pytest.approx(0.0, abs=1e-6)
