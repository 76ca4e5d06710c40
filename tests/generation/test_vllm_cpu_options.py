"""The CPU engine's options from a config: no chunked prefill (vLLM 0.32's CPU runner fails on a seeded request
whose prompt is prefilled in parts), a step budget that holds whole prompts; a real engine serves a burst of
seeded requests whose prompts together exceed vLLM's default budget."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm")

from rlinf_ext.config import load_config  # noqa: E402
from rlinf_ext.generation.vllm_engine import VLLMGenerator  # noqa: E402
from rlinf_ext.generation.vllm_wire import (  # noqa: E402
    CPU_MIN_BATCHED_TOKENS,
    cpu_batched_tokens,
    engine_args,
    options_from_config,
)
from rlinf_ext.protocol.generation import SamplingParams  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_cpu_batched_tokens_holds_whole_contexts():
    assert cpu_batched_tokens(None, 1024) == CPU_MIN_BATCHED_TOKENS
    assert cpu_batched_tokens(4096, 16384) == 16384
    assert cpu_batched_tokens(20000, 1024) == 20000


@pytest.mark.slow
def test_seeded_burst_beyond_the_default_budget(qwen2_head32_dirs):
    from transformers import AutoTokenizer

    model = str(qwen2_head32_dirs[0])
    cfg = load_config(
        "tiny-cpu",
        [f"rollout.model.model_path={model}", "rollout.rollout_backend=vllm", "runner.seq_length=512"],
        strict=False,
    )
    options = options_from_config(cfg, cuda=False)
    args = engine_args(options)
    assert args["enable_chunked_prefill"] is False and args["max_num_batched_tokens"] >= CPU_MIN_BATCHED_TOKENS
    options.kv_cache_memory_bytes = 64 << 20
    tok = AutoTokenizer.from_pretrained(model)
    n = 12  # 12 distinct prompts of 300 tokens (no shared prefix to cache): more than vLLM's default CPU budget (2048)
    prompts = [
        tok.encode(" ".join(f"capital of country {i * 7 + j}" for i in range(60)), add_special_tokens=False)[:300]
        for j in range(n)
    ]
    assert sum(map(len, prompts)) > 2048
    gen = VLLMGenerator.start(options)
    try:
        params = SamplingParams(max_new_tokens=2, temperature=1.0, stop=[])

        async def burst():
            return await asyncio.gather(*(gen.generate(p, params, seed=i) for i, p in enumerate(prompts)))

        results = asyncio.run(burst())
    finally:
        gen.shutdown()
    assert [len(r.output_ids) for r in results] == [2] * n


@pytest.mark.parametrize("k, policy", [(0, "fcfs"), (1, "priority")])
def test_batches_rolled_out_ahead_start_vllm_with_the_priority_policy(k, policy):
    """k > 0: the engine orders its queue by each request's ``priority`` (its batch's dispatch index); the keyword
    and its value exist in the installed vLLM, and so does the ``priority`` argument the generator passes."""
    import dataclasses
    import typing

    from vllm import EngineArgs
    from vllm.config.scheduler import SchedulerPolicy
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.llm_engine import LLMEngine

    from tests.support.signature_checks import bind_like

    cfg = load_config("tiny-cpu", ["rollout.rollout_backend=vllm", f"runner.max_staleness={k}"], strict=False)
    options = options_from_config(cfg, cuda=False)
    assert options.scheduling_policy == policy
    args = engine_args(options)
    assert args.get("scheduling_policy", "fcfs") == policy
    assert "scheduling_policy" in {f.name for f in dataclasses.fields(EngineArgs)}
    assert policy in typing.get_args(SchedulerPolicy)
    bind_like(AsyncLLM.generate, None, {"prompt_token_ids": [1]}, None, "r", priority=3)
    bind_like(LLMEngine.add_request, None, "r", {"prompt_token_ids": [1]}, None, priority=3)
