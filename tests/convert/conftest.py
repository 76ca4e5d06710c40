"""Tiny Qwen2 checkpoints for the conversion tests: the generator's tiny models (at 4 heads, see ``TP2_HEADS``) with
every weight randomised (biases and norms included, so a swapped or dropped tensor cannot go unnoticed), in fp32
and bf16."""

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


# The tests split checkpoints over TP=2, which needs at least two KV groups: the contract's qwen2-tiny has one
# (head size 32 for vLLM), so these models keep its widths and tokenizer with 4 heads in 2 KV groups.
TP2_HEADS = dict(num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="session")
def qwen2_models(tiny_assets, tmp_path_factory, randomized_qwen2):
    """{(tie, dtype_name): HF model folder} for tie in {tied, untied}, dtype in {fp32, bf16}."""
    from transformers import AutoTokenizer

    from rlinf_ext.assets.core.models import TinyQwen2Shape, make_qwen2, save_hf_model

    root = tmp_path_factory.mktemp("convert_models")
    tok = AutoTokenizer.from_pretrained(str(tiny_assets.tokenizer_dir))
    out = {}
    for tie in ("tied", "untied"):
        src = root / f"{tie}-init"
        save_hf_model(make_qwen2(tok, TinyQwen2Shape(tie_word_embeddings=tie == "tied", **TP2_HEADS), seed=0), tok, src)
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            out[(tie, name)] = write_randomized_copy(randomized_qwen2, src, root / f"{tie}-{name}", dtype)
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
