"""Fixtures for config tests: environment variables the reference YAMLs name, set to harmless values."""

from __future__ import annotations

import pytest

REFERENCE_ENV = {
    "RLINF_EXT_QWEN25_3B": "/models/Qwen2.5-3B-Instruct",
    "RLINF_EXT_SEARCHR1_DATA": "/data/searchr1",
    "RLINF_EXT_RETRIEVER_ADDR": "127.0.0.1:8000",
    "RLINF_EXT_EVAL_MODEL": "/models/searchr1-step-200-hf",
    "RLINF_EXT_QWEN25_VL_7B": "/models/Qwen2.5-VL-7B-Instruct",
    "RLINF_EXT_FVQA_DATA": "/data/fvqa",
}


@pytest.fixture
def reference_env(monkeypatch):
    """The env vars of the GPU reference YAMLs (values need not exist: validate does not check paths)."""
    for key, value in REFERENCE_ENV.items():
        monkeypatch.setenv(key, value)
    return REFERENCE_ENV


@pytest.fixture
def no_reference_env(monkeypatch):
    for key in REFERENCE_ENV:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(autouse=True)
def table_gpu_capacity(monkeypatch):
    """The memory plan reads the table's usable memory (models/gpu_capacity.py), whatever GPU the test machine has."""
    from rlinf_ext.config import memory_plan

    monkeypatch.setattr(memory_plan, "local_gpu_total_bytes", lambda: None)
