"""Fixtures for the Megatron-core model tests: the tiny Qwen2 models with every weight randomised.

The generator's checkpoints have zero biases and unit norms; randomising them makes the logits
comparison sensitive to every tensor of the mapping (a swapped bias or norm changes the output).
"""

from __future__ import annotations

import pytest
import torch


def randomized_qwen2(model_dir, seed: int = 0):
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module", params=["tied", "untied"])
def qwen2_pair(request, tiny_assets):
    """(tie mode, randomised HF Qwen2ForCausalLM)."""
    model_dir = tiny_assets.qwen2_tiny if request.param == "tied" else tiny_assets.qwen2_tiny_untied
    return request.param, randomized_qwen2(model_dir)
