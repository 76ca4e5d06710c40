"""The in-process CPU engine (``InprocVLLMEngine``) stands for vLLM's ``AsyncLLM``: every method the generator, the
rollout worker and the weight loads call on it is called as ``AsyncLLM``'s own would be (names, parameters, kinds)."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("vllm")

from vllm.v1.engine.async_llm import AsyncLLM  # noqa: E402

from rlinf_ext.generation.vllm_engine import InprocVLLMEngine  # noqa: E402

CALLED = (
    "generate",
    "pause_generation",
    "resume_generation",
    "is_paused",
    "update_weight_version",
    "collective_rpc",
    "reset_encoder_cache",
    "sleep",
    "wake_up",
)


@pytest.mark.parametrize("name", CALLED)
def test_the_cpu_engine_takes_what_asyncllm_takes(name):
    ours = inspect.signature(getattr(InprocVLLMEngine, name)).parameters
    theirs = inspect.signature(getattr(AsyncLLM, name)).parameters
    for param in ours.values():
        assert param.name in theirs, f"{name}: AsyncLLM has no parameter {param.name!r}"
        assert param.kind == theirs[param.name].kind, f"{name}({param.name}): {param.kind} vs {theirs[param.name].kind}"
    required = [
        p.name for p in theirs.values() if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    assert set(required) <= set(ours), f"{name}: AsyncLLM requires {required}"
    assert inspect.iscoroutinefunction(getattr(InprocVLLMEngine, name)) or inspect.isasyncgenfunction(
        getattr(InprocVLLMEngine, name)
    ), f"{name} is awaited as AsyncLLM's is"
