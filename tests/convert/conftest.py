"""Tiny Qwen2 checkpoints for the conversion tests: the generator's models with every weight randomised
(biases and norms included, so a swapped or dropped tensor cannot go unnoticed), in fp32 and bf16."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch


def write_randomized_copy(randomized_qwen2, src: Path, dst: Path, dtype: torch.dtype, seed: int = 0) -> Path:
    model = randomized_qwen2(src, seed)
    model.to(dtype).save_pretrained(str(dst), safe_serialization=True)
    for f in src.iterdir():  # tokenizer + generation config
        if f.is_file() and not (dst / f.name).exists():
            shutil.copy2(f, dst / f.name)
    return dst


@pytest.fixture(scope="session")
def qwen2_models(tiny_assets, tmp_path_factory, randomized_qwen2):
    """{(tie, dtype_name): HF model folder} for tie in {tied, untied}, dtype in {fp32, bf16}."""
    root = tmp_path_factory.mktemp("convert_models")
    out = {}
    for tie, src in (("tied", tiny_assets.qwen2_tiny), ("untied", tiny_assets.qwen2_tiny_untied)):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            out[(tie, name)] = write_randomized_copy(randomized_qwen2, Path(src), root / f"{tie}-{name}", dtype)
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
