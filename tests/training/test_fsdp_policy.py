"""The vision-language actor (HF Qwen2.5-VL, FSDP2 over gloo for DP=2) on real multimodal trajectories."""

from __future__ import annotations

import socket

import pytest
import torch
from fsdp_policy_helpers import check_every_rank_streams, dp_worker, samples_of, settings

from rlinf_ext.protocol.vl_tokens import IMAGE_PAD
from rlinf_ext.training.fsdp_policy import FSDPPolicy
from tests.support.spawn_ranks import spawn_ranks


@pytest.fixture(scope="module")
def world(vl_world):
    return vl_world


def test_logprobs_equal_the_generators_on_multimodal_trajectories(world):
    mm, trajs = world
    assert any(len(t.images) > 1 for t in trajs), "no trajectory searched images: the test would not cover them"
    policy = FSDPPolicy(mm.qwen2_5_vl_tiny, settings())
    samples = samples_of(trajs)
    got = policy.compute_logprobs(samples)
    worst = 0.0
    for t, lp in zip(trajs, got):
        mask = torch.tensor(t.response_mask, dtype=torch.bool)
        ref = torch.tensor(t.rollout_logprobs)
        assert torch.isfinite(lp).all()
        worst = max(worst, float((lp[mask] - ref[mask]).abs().max()))
    # fp32, the engine's incremental KV-cache passes vs one full forward: 1.0e-5 measured at worst on the tiny VL
    # warm start, 4.8e-7 on the random tiny VL model, under transformers 5.19 (a position bug costs > 1e-3, see below)
    assert worst < 5e-5, worst
    # the positions are mrope's (images take 2-D positions), not an arange
    batch = policy._pack(samples[:1])
    pos = policy.rope_positions(batch)
    assert pos.shape[0] == 3 and not torch.equal(pos[0, 0], torch.arange(pos.shape[-1]))
    # without the temperature the log-probs are those of another distribution
    policy.settings.temperature = 1.0
    plain = policy.compute_logprobs(samples[:1])[0]
    m = torch.tensor(trajs[0].response_mask, dtype=torch.bool)
    assert float((plain[m] - got[0][m]).abs().max()) > 1e-3


def test_masked_tokens_get_exactly_zero_gradient(world):
    mm, trajs = world
    traj = next(t for t in trajs if len(t.images) > 1)  # observation text and image pads, mask 0
    policy = FSDPPolicy(mm.qwen2_5_vl_tiny, settings(group_size=2))
    samples = samples_of([traj, traj], rewards=[1.0, 0.0])
    policy.recompute(samples, compute_ref=False)
    captured = {}
    policy.model.lm_head.register_forward_hook(lambda mod, inp, out: captured.update(logits=out) or out.retain_grad())
    batch = policy._pack(samples[:1])
    loss, _ = policy._micro_loss(samples[:1], torch.tensor([1.0]), num_tokens=float(sum(traj.response_mask)))
    loss.backward()
    grad = captured["logits"].grad[0, :-1]  # row t predicts token t+1
    mask = batch.loss_mask[0].bool()
    pad = policy.processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert (batch.input_ids[0, 1:][~mask] == pad).any()  # observation image pads are among the masked targets
    assert torch.count_nonzero(grad[~mask]) == 0
    assert torch.count_nonzero(grad[mask]) > 0
    # banned ids (vision specials, padded vocabulary) get no gradient through the logits either
    assert torch.count_nonzero(grad[:, policy.banned]) == 0


def _sum_logprob(policy, sample) -> float:
    lp = policy.compute_logprobs([sample])[0]
    return float((lp * torch.tensor(sample.response_mask)).sum())


def test_grpo_step_moves_towards_the_rewarded_trajectory(world):
    mm, trajs = world
    a, b = trajs[0], next(t for t in trajs[1:] if t.response_ids != trajs[0].response_ids)
    policy = FSDPPolicy(mm.qwen2_5_vl_tiny, settings(optimizer="adam", lr=1e-3, clip_grad=1.0))
    samples = samples_of([a, b], rewards=[1.0, 0.0])
    before = [_sum_logprob(policy, s) for s in samples]
    policy.recompute(samples, compute_ref=False)
    metrics = policy.train_step(samples, step=0)
    after = [_sum_logprob(policy, s) for s in samples]
    assert metrics[0]["update_success"] == 1.0 and metrics[0]["grad_norm"] > 0
    assert after[0] > before[0] and after[1] < before[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dp_run(mm, tmp_path, samples, scale_loss: bool) -> dict[str, torch.Tensor]:
    payload, out = tmp_path / "samples.pt", tmp_path / f"dp2-{scale_loss}.pt"
    torch.save((samples, 2), payload)
    spawn_ranks(
        dp_worker,
        args=(2, _free_port(), str(mm.qwen2_5_vl_tiny), str(payload), str(out), scale_loss),
        nprocs=2,
    )
    full = torch.load(out)
    check_every_rank_streams(out, full, 2)  # what a collocated sync sends from each rank
    return full


@pytest.mark.slow  # ~2 min on 2 busy cores: two gloo runs of two spawned ranks
def test_fsdp2_over_two_gloo_ranks_equals_one_process(world, tmp_path):
    mm, trajs = world
    samples = samples_of(trajs[:4], rewards=[1.0, 0.0, 0.0, 1.0])  # two GRPO groups of 2
    one = FSDPPolicy(mm.qwen2_5_vl_tiny, settings())
    before = one.hf_state_dict()
    one.recompute(samples, compute_ref=False)
    one.train_step(samples, step=0)
    expected = one.hf_state_dict()
    moved = max(float((expected[k] - before[k]).abs().max()) for k in expected)
    assert moved > 1e-3
    two = _dp_run(mm, tmp_path, samples, scale_loss=True)
    assert max(float((two[k] - expected[k]).abs().max()) for k in expected) < 1e-5
    averaged = _dp_run(mm, tmp_path, samples, scale_loss=False)  # FSDP2's mean over ranks: half the update
    assert max(float((averaged[k] - expected[k]).abs().max()) for k in expected) > 0.1 * moved


def test_freeze_vision_tower_freezes_exactly_the_vit(world):
    """transformers 5 moved the ViT from `model.visual` to `model.model.visual` (and the decoder under
    `model.model.language_model`): the freeze must still find it and leave the language model trainable."""
    from rlinf_ext.training.fsdp_policy import FSDPSettings

    mm, _ = world
    fsdp = FSDPSettings(
        freeze_vision_tower=True,
        gradient_checkpointing=False,
        reshard_after_forward=True,
        param_dtype="bf16",
        reduce_dtype="fp32",
    )
    policy = FSDPPolicy(mm.qwen2_5_vl_tiny, settings(), fsdp=fsdp)
    frozen = {n for n, p in policy.model.named_parameters() if not p.requires_grad}
    assert frozen and all(".visual." in f".{n}" for n in frozen)
    assert frozen == {n for n, _ in policy.model.named_parameters() if n.startswith("model.visual.")}
