"""The SGLang rollout worker's pure parts: the post-sync probe check and the weight buckets (the worker needs a
GPU)."""

from __future__ import annotations

import pytest
import torch

from rlinf_ext.workers.rollout_sglang import probe_logprob_gap, weight_buckets
from rlinf_ext.workers.weight_sync import WeightSyncError


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


def test_weight_buckets_bound_the_bytes_per_transfer():
    state = {"a": torch.zeros(10), "b": torch.zeros(10), "c": torch.zeros(30), "d": torch.zeros(5)}  # fp32: 40/40/120/20 B
    buckets = [[name for name, _ in b] for b in weight_buckets(state, max_bytes=80)]
    assert buckets == [["a", "b"], ["c"], ["d"]]
    assert sum(len(b) for b in weight_buckets(state)) == 4
