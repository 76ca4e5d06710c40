"""Random-weight Hugging Face Qwen2 checkpoints of real model shapes, built offline with transformers from a
config dict (nothing is downloaded): the memory benchmarks and the GPU smoke script load them through the
conversion mapping exactly like a real checkpoint.
"""

from __future__ import annotations

from pathlib import Path

# config.json fields of the shapes (Qwen2.5 dimensions; "tiny" = the test model's)
QWEN2_SHAPES: dict[str, dict] = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=1472,
        tie_word_embeddings=True,
    ),
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "3b": dict(
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
}


def shape_config(shape: str | dict, **changes) -> dict:
    """The config dict of a named shape (or a dict of Qwen2Config fields), with ``changes`` applied."""
    base = QWEN2_SHAPES[shape] if isinstance(shape, str) else shape
    return {**base, **changes}


def write_random_qwen2(
    out_dir: str | Path, shape: str | dict, *, seed: int = 0, dtype: str = "float32", device: str = "cpu"
) -> Path:
    """Save a randomly initialised ``Qwen2ForCausalLM`` of ``shape`` into ``out_dir`` (config.json +
    safetensors); ``device`` only speeds up the initialisation of large shapes (e.g. "cuda")."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    fields = shape_config(shape)
    config = Qwen2Config(
        **fields,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=32768,
        max_window_layers=fields["num_hidden_layers"],
        use_sliding_window=False,
        sliding_window=None,
        torch_dtype=dtype,
        attention_dropout=0.0,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    return out
