"""The actor's own checkpoint is what mg2hf converts: train a step, save (Megatron's legacy layout), convert
with the mg2hf entry point and through the launcher, load with transformers: same weights, same logits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlinf_ext.runner.checkpoints import check_complete, finalize, staging_dir
from rlinf_ext.training.grpo_policy import Sample
from rlinf_ext.training.megatron_policy import MegatronPolicy
from rlinf_ext.training.rl_math import LossConfig
from rlinf_ext.training.settings import ActorSettings

LOGIT_ATOL = 1e-4  # fp32 on CPU; Megatron and HF differ only in summation order


def _train_one_step(model_dir) -> MegatronPolicy:
    settings = ActorSettings(
        group_size=2,
        n_minibatches=1,
        micro_batch_size=2,
        logprob_micro_batch_size=2,
        loss=LossConfig(kl_beta=0.0),
        lr=1e-2,
        weight_decay=0.0,
        total_train_steps=2,
    )
    policy = MegatronPolicy(model_dir, settings)
    g = torch.Generator().manual_seed(0)
    vocab = policy.model.hf_vocab_size
    samples = [
        Sample(
            torch.randint(3, vocab, (4,), generator=g).tolist(),
            torch.randint(3, vocab, (6,), generator=g).tolist(),
            [1] * 6,
            reward=float(i % 2),
        )
        for i in range(4)
    ]
    policy.recompute(samples, compute_ref=False)
    policy.train_step(samples, step=0)
    return policy


def _hf_logits(path, ids):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(input_ids=ids).logits


@pytest.mark.timeout(300)
def test_actor_checkpoint_converts_as_is_to_the_trained_model(tiny_assets, tmp_path, read_weights_dir):
    from rlinf_ext.convert.mg2hf import convert_mg_to_hf
    from rlinf_ext.models.megatron import forward_logits
    from rlinf_ext.runner.errors import LaunchError
    from rlinf_ext.runner.prepare import convert_last_checkpoint_to_hf

    template = tiny_assets.qwen2_tiny
    policy = _train_one_step(template)
    root = tmp_path / "run" / "checkpoints"
    tmp = staging_dir(root, 1)
    policy.save(tmp / "actor", iteration=1)
    ckpt = finalize(tmp, 1)
    assert check_complete(ckpt) is None

    result = convert_mg_to_hf(ckpt / "actor", tmp_path / "hf", template, progress=False)
    assert (result.tp, result.pp) == (1, 1) and result.iter_dir.name == "iter_0000001"

    # weights: exactly the trained policy's (mapped to HF names), and not the template's
    converted, trained, original = read_weights_dir(tmp_path / "hf"), policy.hf_state_dict(), read_weights_dir(template)
    assert set(converted) == set(original)
    assert all(torch.equal(converted[k], trained[k]) for k in converted)
    assert any(not torch.equal(converted[k], original[k]) for k in converted)

    # logits: transformers on the converted folder == the actor's own forward
    ids = torch.randint(3, policy.model.hf_vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    policy.model.eval()
    with torch.no_grad():
        mg_logits = forward_logits(policy.model, ids)
    hf_logits = _hf_logits(tmp_path / "hf", ids)
    assert mg_logits.shape == hf_logits.shape
    assert (mg_logits - hf_logits).abs().max().item() < LOGIT_ATOL
    template_logits = _hf_logits(template, ids)
    assert (template_logits - hf_logits).abs().max().item() > 100 * LOGIT_ATOL  # the training step shows

    # the launcher converts the same directory (no rewriting step) and gets the same files
    cfg = SimpleNamespace(
        runner=SimpleNamespace(output_dir=str(tmp_path), experiment_name="run"),
        rollout=SimpleNamespace(model=SimpleNamespace(model_path=str(template))),
        actor=SimpleNamespace(training_backend="megatron"),
    )
    found, hf_dir = convert_last_checkpoint_to_hf(cfg)
    assert found == ckpt and hf_dir == tmp_path / "run" / "hf_model" / "global_step_1"
    launched = read_weights_dir(hf_dir)
    assert set(launched) == set(converted) and all(torch.equal(launched[k], converted[k]) for k in converted)

    # a checkpoint in the pre-Megatron-layout format is refused with the reason
    old = staging_dir(root, 2)
    (old / "actor").mkdir()
    (old / "actor" / "model.pt").write_bytes(b"x")
    finalize(old, 2)
    with pytest.raises(LaunchError, match="not a Megatron checkpoint"):
        convert_last_checkpoint_to_hf(cfg)


@pytest.fixture
def read_weights_dir():
    from safetensors.torch import load_file

    def read(path):
        state = {}
        for f in sorted(path.glob("*.safetensors")):
            state.update(load_file(str(f)))
        return state

    return read
