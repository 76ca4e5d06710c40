"""The post-sync probe check (``sync/probe.py``): the engine's prompt log-probs against the actor's logits."""

from __future__ import annotations

import pytest
import torch

from rlinf_ext.sync.probe import probe_logprob_gap
from rlinf_ext.sync.weight_sync import WeightSyncError


def test_probe_logprob_gap_compares_engine_and_actor():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (1, 6))
    logits = torch.randn(1, 6, 50) * 3
    exact = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
    entries = [(None, int(ids[0, 0]), None)] + [(lp, int(t), None) for lp, t in zip(exact, ids[0, 1:])]
    assert probe_logprob_gap(ids, logits, entries) < 1e-5
    shifted = [entries[0]] + [(lp + 1.0, t, x) for lp, t, x in entries[1:]]
    assert probe_logprob_gap(ids, logits, shifted) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(WeightSyncError, match="probe log-probs"):
        probe_logprob_gap(ids, logits, entries[:-1])
    # the multimodal probe compares only the text after its image: a gap on the image's positions is not counted
    image_off = [entries[0]] + [(lp + (5.0 if k < 2 else 0.0), t, x) for k, (lp, t, x) in enumerate(entries[1:])]
    assert probe_logprob_gap(ids, logits, image_off, positions=[3, 4, 5]) < 1e-5
    assert probe_logprob_gap(ids, logits, image_off, positions=[2, 3]) == pytest.approx(2.5, abs=1e-5)


def test_the_probe_tolerance_follows_the_engines_precision():
    from types import SimpleNamespace

    from rlinf_ext.sync.probe import FP32_PROBE_ATOL, HALF_PROBE_ATOL, probe_atol
    from rlinf_ext.workers.rollout_sglang import SGLangRolloutState
    from rlinf_ext.workers.rollout_vllm import VLLMRolloutState

    assert probe_atol("fp32") == FP32_PROBE_ATOL == 1e-3
    assert probe_atol("bf16") == probe_atol("fp16") == HALF_PROBE_ATOL == 0.5
    with pytest.raises(ValueError, match="expected fp32, bf16 or fp16"):
        probe_atol("float16")

    def cfg(precision):
        return SimpleNamespace(
            rollout=SimpleNamespace(
                model=SimpleNamespace(precision=precision), tensor_parallel_size=1, return_logprobs=False
            ),
            runner=SimpleNamespace(max_staleness=0, partial_rollout=False),
        )

    # a bf16 engine on GPUs (the reference configs) against the actor's fp32 logits: rounding, not a failed sync
    for precision, atol in (("bf16", 0.5), ("fp16", 0.5), ("fp32", 1e-3)):
        vllm = VLLMRolloutState()
        vllm._setup(cfg(precision))
        sglang = SGLangRolloutState()
        sglang._setup(cfg(precision), collocated=True, distributed=False)
        assert vllm.sync_atol == sglang.sync_atol == atol, precision
    explicit = VLLMRolloutState()
    explicit._setup(cfg("bf16"), sync_atol=1e-2)
    assert explicit.sync_atol == 1e-2
