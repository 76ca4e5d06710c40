"""The contract's tiny Qwen2 runs on vLLM: head size 32 (vLLM's CPU attention refuses 16, the old 4-head shape's),
with the parameter count of that old shape (k/v stay 64 x 32), and a real vLLM engine started on the generated
``models/qwen2-tiny`` gives HF's greedy tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]

# one greedy generation on vLLM (in a fresh process: this one loaded numba through the tiny assets' BM25 step, and
# an in-process vLLM engine cannot start beside it: tests/conftest.py, pytest_collection_modifyitems)
ENGINE_SCRIPT = """
import asyncio, json, sys
from rlinf_ext.generation.vllm_engine import VLLMGenerator
from rlinf_ext.generation.vllm_wire import VLLMEngineOptions
from rlinf_ext.protocol.generation import SamplingParams
gen = VLLMGenerator.start(VLLMEngineOptions(model_path=sys.argv[1], dtype="float32", max_model_len=256,
                                            kv_cache_memory_bytes=16 << 20, max_num_seqs=4))
prompt = json.loads(sys.argv[2])
out = asyncio.run(gen.generate(prompt, SamplingParams(max_new_tokens=12, stop=[], do_sample=False)))
gen.shutdown()
print("RESULT " + json.dumps(out.output_ids), flush=True)
import os; os._exit(0)  # no teardown of the vLLM stack
"""


def test_tiny_shape_has_head_size_32_and_the_old_shapes_parameter_count(tiny_assets):
    from transformers import AutoTokenizer

    from rlinf_ext.assets.core.models import TinyQwen2Shape, make_qwen2, padded_vocab_size

    tok = AutoTokenizer.from_pretrained(str(tiny_assets.tokenizer_dir))
    shape = TinyQwen2Shape()
    assert shape.hidden_size // shape.num_attention_heads == 32
    new = make_qwen2(tok, shape, seed=0)
    old = make_qwen2(tok, TinyQwen2Shape(num_attention_heads=4, num_key_value_heads=2), seed=0)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # by hand, per layer: q 64x64+64, k and v 64x32+32 each, o 64x64, MLP 3 x 64x176, two norms of 64;
    # plus the final norm and the tied embedding (vocab x 64)
    per_layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 176 + 2 * 64
    assert count(new) == count(old) == 2 * per_layer + 64 + padded_vocab_size(len(tok)) * 64
    attn = new.model.layers[0].self_attn
    assert (attn.q_proj.weight.shape, attn.k_proj.weight.shape, attn.v_proj.weight.shape) == (
        torch.Size([64, 64]),
        torch.Size([32, 64]),
        torch.Size([32, 64]),
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_vllm_cpu_engine_starts_on_the_generated_tiny_model_and_matches_hf_greedy(tiny_assets):
    pytest.importorskip("vllm")
    from rlinf_ext.generation.hf import HFGenerator
    from rlinf_ext.protocol.generation import SamplingParams

    hf = HFGenerator.from_pretrained(tiny_assets.qwen2_tiny)
    prompt = hf.tokenizer.encode("Question: who founded the city?\n", add_special_tokens=False)
    res = subprocess.run(
        [sys.executable, "-c", ENGINE_SCRIPT, str(tiny_assets.qwen2_tiny), json.dumps(prompt)],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=str(REPO),
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    ours = json.loads(next(line for line in res.stdout.splitlines() if line.startswith("RESULT "))[7:])
    ref = hf.generate_batch_sync([prompt], SamplingParams(max_new_tokens=12, stop=[], do_sample=False))[0]
    assert ours == ref.output_ids and len(ours) > 0
