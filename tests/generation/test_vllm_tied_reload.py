"""A new input embedding reaches a tied output head after an in-place weight load into vLLM (CPU, in process):
the prompt log-probs equal the HF model's with the same weights. vLLM prepacks the head's weight for the CPU GEMM;
the reload used to leave that copy stale (``vllm_engine.refresh_tied_head``)."""

from __future__ import annotations

import asyncio

import pytest
import torch

pytest.importorskip("vllm")

from rlinf_ext.generation.vllm_engine import VLLMGenerator  # noqa: E402
from rlinf_ext.generation.vllm_wire import VLLMEngineOptions  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: a vLLM engine start


def test_changed_embedding_reaches_the_tied_head_after_reload(qwen2_head32_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(qwen2_head32_dirs[0])
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert hf.config.tie_word_embeddings
    ids = AutoTokenizer.from_pretrained(path).encode(
        "Question 3: which city is the capital of country 5?", add_special_tokens=False
    )
    gen = VLLMGenerator.start(
        VLLMEngineOptions(
            model_path=path, dtype="float32", max_model_len=256, kv_cache_memory_bytes=16 << 20, max_num_seqs=4
        )
    )

    def gap() -> float:
        entries = asyncio.run(gen.prompt_logprobs(ids))
        ours = torch.tensor([e[0] for e in entries[1:]])
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0, :-1], -1).gather(
                -1, torch.tensor(ids[1:])[:, None]
            )
        return float((ref.squeeze(-1) - ours).abs().max())

    try:
        assert gap() < 1e-4
        with torch.no_grad():  # only the embedding changes (the head shares it)
            hf.model.embed_tokens.weight.add_(
                0.05 * torch.randn(hf.model.embed_tokens.weight.shape, generator=torch.Generator().manual_seed(0))
            )
        asyncio.run(gen.load_weights([("model.embed_tokens.weight", hf.model.embed_tokens.weight.detach().clone())]))
        assert gap() < 1e-4
    finally:
        gen.shutdown()
