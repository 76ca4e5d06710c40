"""HF actor checkpoints: the HF directory is the export, resume continues exactly (also on another number of
FSDP2 ranks than the one that saved), incomplete ones are refused."""

from __future__ import annotations

import os
import socket
import warnings

import pytest
import torch
from fsdp_policy_helpers import samples_of, settings

from rlinf_ext.runner.checkpoints import finalize, latest_complete_checkpoint, staging_dir
from rlinf_ext.training.fsdp_policy import FSDPPolicy
from rlinf_ext.training.fsdp_policy_io import MARKER
from tests.support.spawn_ranks import spawn_ranks


def _settings():
    # Adam state and a decaying LR: resume must restore both to continue exactly. The schedule spans 4 steps so
    # the third (the one after the resume) still has a non-zero LR: with 3 it decays to 0 there and any state passes
    return settings(optimizer="adam", lr=2e-3, clip_grad=1.0, lr_decay_style="linear", total_train_steps=4)


def _step(policy, samples, step, layout=None):
    policy.recompute(samples, compute_ref=False)
    return policy.train_step(samples, step=step, layout=layout)[0]["grad_norm"]


def _save(policy, root, step):
    tmp = staging_dir(root, step)
    policy.save(tmp / "actor", iteration=step)
    return finalize(tmp, step)


@pytest.fixture(scope="module")
def one_process(vl_world, tmp_path_factory):
    """An uninterrupted 3-step run (its step-2 gradient norm, its weights) and a 2-step run checkpointed at step 2
    (the policy, the checkpoint's directory), in one process: what the resumes are compared with."""
    mm, trajs = vl_world
    samples = samples_of(trajs[:4], rewards=[1.0, 0.0, 0.0, 1.0])  # two GRPO groups of 2: one per rank below
    straight = FSDPPolicy(mm.qwen2_5_vl_tiny, _settings())
    norms = [_step(straight, samples, step) for step in range(3)]
    first = FSDPPolicy(mm.qwen2_5_vl_tiny, _settings())
    for step in range(2):
        _step(first, samples, step)
    ckpt = _save(first, tmp_path_factory.mktemp("one-process") / "checkpoints", 2)
    return samples, norms[2], straight.hf_state_dict(), first, ckpt / "actor"


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
def test_resume_two_plus_one_equals_three(vl_world, one_process):
    mm, _ = vl_world
    samples, norm, expected, first, ckpt = one_process
    resumed = FSDPPolicy(mm.qwen2_5_vl_tiny, _settings())
    assert resumed.load(ckpt) == 2 and resumed.optimizer_steps == 2
    assert _step(resumed, samples, 2) == pytest.approx(norm, rel=1e-6)
    assert _max_diff(resumed.hf_state_dict(), expected) < 1e-6
    # the directory is a plain HF model: transformers loads it and it matches the policy
    from transformers import Qwen2_5_VLForConditionalGeneration

    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt)
    assert type(loaded).__name__ == "Qwen2_5_VLForConditionalGeneration"
    mid = first.hf_state_dict()
    assert all(torch.equal(v, mid[k]) for k, v in loaded.state_dict().items())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resharding_worker(
    rank: int, world: int, port: int, model_dir: str, payload: str, one_rank_ckpt: str, out: str
) -> None:
    """One gloo rank of an FSDP2 actor: resumes the one-process checkpoint and takes step 2 (rank 0 writes the
    weights and the gradient norm to ``out``), then trains a fresh policy 2 steps and saves ``<out>.ckpt/actor``."""
    from rlinf_ext.training.data_parallel import ShardLayout
    from tests.support.gloo_dp import init_gloo_dp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dp = init_gloo_dp()
    samples = torch.load(payload, weights_only=False)
    share = len(samples) // world
    mine = list(range(rank * share, (rank + 1) * share))
    layout, own = ShardLayout(tuple(mine), len(samples)), [samples[i] for i in mine]
    resumed = FSDPPolicy(model_dir, _settings(), dp=dp)
    assert resumed.load(one_rank_ckpt) == 2 and resumed.optimizer_steps == 2
    norm = _step(resumed, own, 2, layout)
    weights = resumed.hf_state_dict()  # collective; rank 0 alone gets them
    if rank == 0:
        torch.save((weights, norm), out)
    del resumed
    first = FSDPPolicy(model_dir, _settings(), dp=dp)
    for step in range(2):
        _step(first, own, step, layout)
    first.save(f"{out}.ckpt/actor", iteration=2)  # every rank gathers, rank 0 writes
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # ~1 min on 2 busy cores: one spawn of two gloo ranks
@pytest.mark.timeout(600)
def test_a_checkpoint_resumes_on_another_number_of_ranks(vl_world, one_process, tmp_path):
    """1 -> 2 and 2 -> 1 FSDP2 ranks: weights and Adam moments come back, the step after the resume equals the
    third step of an uninterrupted one-process run (gradient norm and weights), and both checkpoints name the
    same keys."""
    from safetensors import safe_open

    mm, _ = vl_world
    samples, expected_norm, expected, _, one_rank = one_process
    payload, out = tmp_path / "samples.pt", tmp_path / "two-ranks.pt"
    torch.save(samples, payload)
    spawn_ranks(
        resharding_worker,
        args=(2, _free_port(), str(mm.qwen2_5_vl_tiny), str(payload), str(one_rank), str(out)),
        nprocs=2,
    )
    weights, norm = torch.load(out)
    assert norm == pytest.approx(expected_norm, rel=1e-5) and _max_diff(weights, expected) < 1e-5  # 1 -> 2
    two_ranks = tmp_path / "two-ranks.pt.ckpt" / "actor"
    resumed = FSDPPolicy(mm.qwen2_5_vl_tiny, _settings())
    assert resumed.load(two_ranks) == 2 and resumed.optimizer_steps == 2
    assert _step(resumed, samples, 2) == pytest.approx(expected_norm, rel=1e-5)  # 2 -> 1
    assert _max_diff(resumed.hf_state_dict(), expected) < 1e-5

    def names(directory):
        with safe_open(next(directory.glob("*.safetensors")), "pt") as f:
            return set(f.keys())

    assert names(one_rank) == names(two_ranks)  # one checkpoint layout, whatever saved it


def test_truncated_or_unmarked_checkpoints_are_skipped_or_refused(vl_world, tmp_path):
    mm, trajs = vl_world
    policy = FSDPPolicy(mm.qwen2_5_vl_tiny, _settings())
    root = tmp_path / "checkpoints"
    good = _save(policy, root, 1)
    bad = _save(policy, root, 2)
    weights = next(bad.glob("actor/*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert latest_complete_checkpoint(root) == good
    assert any("truncated" in str(w.message) for w in caught)
    (good / "actor" / MARKER).unlink()
    with pytest.raises(ValueError, match="not a complete HF actor checkpoint"):
        policy.load(good / "actor")
