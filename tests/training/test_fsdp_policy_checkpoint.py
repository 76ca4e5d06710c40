"""HF actor checkpoints: the HF directory is the export, resume continues exactly, incomplete ones are refused."""

from __future__ import annotations

import warnings

import pytest
import torch
from fsdp_policy_helpers import samples_of, settings

from rlinf_ext.runner.checkpoints import finalize, latest_complete_checkpoint, staging_dir
from rlinf_ext.training.fsdp_policy import FSDPPolicy
from rlinf_ext.training.fsdp_policy_io import MARKER


def _settings():
    # Adam state and a decaying LR: resume must restore both to continue exactly
    return settings(optimizer="adam", lr=2e-3, clip_grad=1.0, lr_decay_style="linear", total_train_steps=3)


def _step(policy, samples, step):
    policy.recompute(samples, compute_ref=False)
    policy.train_step(samples, step=step)


def _save(policy, root, step):
    tmp = staging_dir(root, step)
    policy.save(tmp / "actor", iteration=step)
    return finalize(tmp, step)


@pytest.mark.slow
def test_resume_two_plus_one_equals_three(vl_world, tmp_path):
    mm, trajs = vl_world
    samples = samples_of(trajs[:4], rewards=[1.0, 0.0, 0.0, 1.0])
    straight = FSDPPolicy(mm.qwen2_5_vl_tiny, _settings())
    for step in range(3):
        _step(straight, samples, step)
    first = FSDPPolicy(mm.qwen2_5_vl_tiny, _settings())
    for step in range(2):
        _step(first, samples, step)
    ckpt = _save(first, tmp_path / "checkpoints", 2)
    resumed = FSDPPolicy(mm.qwen2_5_vl_tiny, _settings())
    assert resumed.load(ckpt / "actor") == 2 and resumed.optimizer_steps == 2
    _step(resumed, samples, 2)
    a, b = straight.hf_state_dict(), resumed.hf_state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    # the directory is a plain HF model: transformers loads it and it matches the policy
    from transformers import Qwen2_5_VLForConditionalGeneration

    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt / "actor")
    assert type(loaded).__name__ == "Qwen2_5_VLForConditionalGeneration"
    mid = first.hf_state_dict()
    assert all(torch.equal(v, mid[k]) for k, v in loaded.state_dict().items())


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
