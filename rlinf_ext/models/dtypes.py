"""The one table of dtype names: RLinf's precision names (``fp32``/``bf16``/``fp16``, used by
``actor.model.precision`` and ``rollout.model.precision``) and Hugging Face's (``float32``/``bfloat16``/
``float16``, used by ``config.json``, ``rollout.hf.dtype`` and SGLang's ``dtype``)."""

from __future__ import annotations

import torch

PRECISIONS = ("fp32", "bf16", "fp16")
_BY_PRECISION = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_HF_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_BY_HF_NAME = {name: dtype for dtype, name in _HF_NAMES.items()}


def dtype_of_precision(precision: str, key: str = "precision") -> torch.dtype:
    """``fp32``/``bf16``/``fp16`` -> torch dtype; ``key`` names the config key in the error."""
    if precision not in _BY_PRECISION:
        raise ValueError(f"{key}={precision!r}; use one of {list(PRECISIONS)}.")
    return _BY_PRECISION[precision]


def dtype_of_hf_name(name: str, key: str = "dtype") -> torch.dtype:
    """``float32``/``bfloat16``/``float16`` -> torch dtype."""
    if name not in _BY_HF_NAME:
        raise ValueError(f"{key}={name!r}; use one of {sorted(_BY_HF_NAME)}.")
    return _BY_HF_NAME[name]


def hf_name_of(dtype: torch.dtype) -> str | None:
    """torch dtype -> Hugging Face's name (None for dtypes HF configs do not name)."""
    return _HF_NAMES.get(dtype)


def hf_name_of_precision(precision: str, key: str = "precision") -> str:
    """``bf16`` -> ``bfloat16`` (SGLang's and HF's spelling of RLinf's precision names)."""
    return _HF_NAMES[dtype_of_precision(precision, key)]


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast compute dtype of a mixed-precision setting; None for fp32 (no autocast)."""
    dtype = dtype_of_precision(precision)
    return None if dtype == torch.float32 else dtype
