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
