"""Logit equality between the HF model and Megatron-core GPTModel loaded from the converted checkpoint:
TP=2 across two gloo processes (TP=1 in-process is in tests/models and the --verify test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlinf_ext.convert.hf2mg import convert_hf_to_mg
from rlinf_ext.models.cpu_shims import free_port
from rlinf_ext.models.megatron import default_position_ids

WORKER = Path(__file__).with_name("tp_logits_worker.py")
LOGIT_ATOL = 1e-4  # fp32; TP changes only the summation order of the row-parallel all-reduce


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tp2_logits_in_two_gloo_processes_match_hf(qwen2_models, tmp_path):
    from transformers import AutoModelForCausalLM

    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 1000, (2, 11), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    torch.save({"ids": ids, "mask": mask}, tmp_path / "batch.pt")
    cases = []
    for tie in ("tied", "untied"):
        src = qwen2_models[(tie, "fp32")]
        # local layer-norm names for one, TE names for the other: both load into the local-spec model
        convert_hf_to_mg(src, tmp_path / f"mg-{tie}", tp=2, pp=1, te_layernorm_names=tie == "tied", progress=False)
        cases += [str(tmp_path / f"mg-{tie}"), str(src), str(tmp_path / f"logits-{tie}.pt")]
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), "2", str(port), str(tmp_path / "batch.pt"), *cases],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)[-4000:]
    for tie in ("tied", "untied"):
        hf = AutoModelForCausalLM.from_pretrained(str(qwen2_models[(tie, "fp32")]), dtype=torch.float32).eval()
        assert hf.config.vocab_size > 1000
        with torch.no_grad():
            hf_logits = hf(input_ids=ids, attention_mask=mask, position_ids=default_position_ids(mask, 2, 11)).logits
        mg_logits = torch.load(tmp_path / f"logits-{tie}.pt")
        assert mg_logits.shape == hf_logits.shape
        real = mask.bool()
        assert (mg_logits - hf_logits)[real].abs().max().item() < LOGIT_ATOL, tie
