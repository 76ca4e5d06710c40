"""The warm starts the tiny experiments train from, as built into the asset cache: their split checks and the gates
on the held-out questions hold (a gate missed by a code change fails here, not in a learning run an hour later)."""

from __future__ import annotations

import pytest

from rlinf_ext.assets.core.tiny import read_manifest
from rlinf_ext.assets.mmsearch.sft import GATE as MM_GATE
from rlinf_ext.assets.mmsearch.sft import gate_verdict as mm_gate_verdict
from rlinf_ext.assets.registry.warm_start import GATE as REGISTRY_GATE

pytestmark = pytest.mark.slow  # the session's warm starts (cached in CI)


def test_registry_warm_start_reads_and_the_split_does_not_leak(tiny_assets_registry):
    entry = read_manifest(tiny_assets_registry.root)["registry"]
    assert entry["heldout_fact_overlap"] == 0
    assert entry["heldout_subjects_asked_in_train"] == 0
    assert entry["no_observation_em"] <= 0.05  # recall impossible
    assert entry["retrieval_top1_query"] == 1.0
    assert set(entry["warm_start_gate"]) == {k for k, _, _ in REGISTRY_GATE}
    assert entry["warm_start_gate_passed"], entry["warm_start_gate"]


def test_vl_warm_start_gate_and_split(tiny_mm_assets_sft):
    entry = read_manifest(tiny_mm_assets_sft.root)["mm_sft"]
    assert entry["heldout_emblem_overlap"] == 0
    assert mm_gate_verdict(entry["warm_start_gate"]) == {k: True for k, _, _ in MM_GATE}, entry["warm_start_gate"]
    assert entry["warm_start_gate_passed"]
