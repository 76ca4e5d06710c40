"""Partial rollout on vLLM through the real launcher: ``rlinf-ext train tiny-cpu`` with the in-process vLLM engine,
batches dispatched one step ahead (``runner.max_staleness=1``), weight syncs that cut the turns in flight with
vLLM's keep pause (``runner.partial_rollout=true``) and every search slowed by 300 ms (``benchmarks/slow_search.py``)
so that the next batch is mid-turn when the weights sync. One launch, no evaluation (~47 s on 2 cores).

What reaches the actor: each token's weight version as vLLM labelled it (a turn the sync cut carries two), the
staleness bound on the oldest token (none older than k), the engine's log-probs as the behaviour policy. The
engine side (the cut, the prefix, the continuation on the new weights) is tests/generation/test_vllm_engine.py's."""

from __future__ import annotations

import math

import pytest
from launch_helpers import CI_SIZE, launch, metrics_rows

from benchmarks.slow_search import LATENCY_ENV
from rlinf_ext.protocol import metric_keys as mk

pytestmark = pytest.mark.slow

STEPS = 5
ARGS = [
    a
    for a in CI_SIZE
    if not a.startswith(
        ("runner.save_interval=", "algorithm.sampling_params.max_new_tokens=", "agentloop.response_length_total=")
    )
] + [
    "runner.save_interval=-1",
    "rollout.rollout_backend=vllm",
    "rollout.return_logprobs=true",
    "runner.max_staleness=1",
    "runner.admission=group",
    "runner.partial_rollout=true",
    "algorithm.sampling_params.max_new_tokens=64",
    "agentloop.response_length_total=256",
    "agentloop.searchr1.tools=[benchmarks.slow_search:SlowSearch]",
    f"runner.max_steps={STEPS}",
    "--no-eval",
]


@pytest.mark.timeout(900)
def test_vllm_syncs_cut_turns_and_every_trained_token_is_within_k(tiny_assets_registry, tmp_path, monkeypatch):
    monkeypatch.setenv(LATENCY_ENV, "300")
    code, log = launch(
        [
            f"paths.tiny_assets={tiny_assets_registry.root}",
            f"runner.output_dir={tmp_path}",
            f"rollout.model.model_path={tiny_assets_registry.qwen2_tiny}",
            *ARGS,
        ],
        timeout=600,
    )
    assert code == 0, log[-5000:]
    rows = metrics_rows(tmp_path / "searchr1-grpo-tiny-cpu")
    assert [r["step"] for r in rows] == list(range(STEPS + 1))  # step 0: the validation before training
    for row in rows[1:]:
        step = row["step"]
        assert row[mk.STALENESS_HEAD_MAX] <= 1 and row[mk.STALENESS_TOKEN_MAX] <= 1, step
        assert math.isclose(row[mk.token_staleness(0)] + row.get(mk.token_staleness(1), 0.0), 1.0), row
        assert math.isfinite(row[mk.ACTOR_BEHAVIOUR_WEIGHT_MEAN]) and math.isfinite(row[mk.ACTOR_BEHAVIOUR_KL])
    # a sync landed inside turns: vLLM labelled their tokens with two versions, and the actor trained them
    assert any(row[mk.TRAJECTORIES_TWO_VERSIONS] > 0 for row in rows[1:]), [
        row[mk.TRAJECTORIES_TWO_VERSIONS] for row in rows[1:]
    ]
