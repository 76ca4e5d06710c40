"""Tiny Qwen2 checkpoints for the conversion tests: the generator's models with every weight randomised
(biases and norms included, so a swapped or dropped tensor cannot go unnoticed), in fp32 and bf16."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch


def write_randomized_copy(src: Path, dst: Path, dtype: torch.dtype, seed: int = 0) -> Path:
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(str(src), torch_dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
    model.to(dtype).save_pretrained(str(dst), safe_serialization=True)
    for f in src.iterdir():  # tokenizer + generation config
        if f.is_file() and not (dst / f.name).exists():
            shutil.copy2(f, dst / f.name)
    return dst


@pytest.fixture(scope="session")
def qwen2_models(tiny_assets, tmp_path_factory):
    """{(tie, dtype_name): HF model folder} for tie in {tied, untied}, dtype in {fp32, bf16}."""
    root = tmp_path_factory.mktemp("convert_models")
    out = {}
    for tie, src in (("tied", tiny_assets.qwen2_tiny), ("untied", tiny_assets.qwen2_tiny_untied)):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            out[(tie, name)] = write_randomized_copy(Path(src), root / f"{tie}-{name}", dtype)
    return out


def _load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


@pytest.fixture(scope="session")
def read_weights():
    """``read_weights(folder) -> {name: tensor}`` over every safetensors file in a HF folder."""
    return _load_safetensors_dir
