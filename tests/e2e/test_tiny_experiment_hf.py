"""End to end on the portable fallback engine with the asynchronous pipeline all on, preempted: the tiny Search-R1
experiment through the real launcher with ``rollout.rollout_backend=hf`` (transformers ``generate`` in the rollout
worker) for training and evaluation, batches dispatched one step ahead (``runner.max_staleness=1``), steps that
train the first prompt groups to finish (``runner.admission=group``), weight syncs that cut the turns in flight
(``runner.partial_rollout=true``) and every search slowed by 300 ms (``benchmarks/slow_search.py``), stopped by
SIGTERM and resumed. Two launches for all of it (a launch costs ~45 s of start-up).

tiny-cpu.yaml runs vLLM at k=0 (the reference recipe's tiny run, tests/e2e/test_reference_recipe.py, and the
learning run cover that engine and order); this module keeps the fallback's launch path honest, tiny-cpu.yaml's own
(tiny assets, the launched BM25 server) and the asynchronous pipeline: validation before training, GRPO steps with
a weight sync after each update while the next batch is in flight and mid-turn, the decoupled loss on the engine's
log-probs, Megatron -> HF conversion and the evaluation of the converted model, on the contract's random tiny model
(its turns run to max_new_tokens, so the next batch is mid-turn when the weights sync).

SIGTERM (what Slurm and Kubernetes send before they kill a job) once step 1 is logged makes the launcher finish the
step in flight, write a checkpoint (with the prompts dispatched and not trained yet), abort the batches dispatched
ahead and discard them, and exit with its own code (75); the same command with ``runner.resume_dir=auto``
dispatches the carried prompts again, continues to the end, converts and evaluates. Across the stop every prompt of
the batches the run reads is trained exactly once (batch admission's exact per-step order is checked on the fake
workers, tests/runner/test_trainer_pipeline.py).
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from launch_helpers import CI_SIZE, launch, metrics_rows, when_step_logged

from benchmarks.slow_search import LATENCY_ENV
from rlinf_ext.assets.registry.world import RELATIONS
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner.checkpoints import check_complete, latest_complete_checkpoint
from rlinf_ext.runner.commands import EXIT_PREEMPTED

pytestmark = pytest.mark.slow

HF = "rollout.rollout_backend=hf"
VLLM_SYNC_LINE = "Successfully reset prefix cache"  # vLLM logs it at each weight sync
MAX_STEPS = 6  # a SIGTERM that reaches the second step late still stops well before the last
GROUP = 2
EVAL_OVERRIDES = ["--eval-override", "data.data_size=1", "--eval-override", HF]
# CI_SIZE without its checkpoint every step (a checkpoint before the last step can only come from the SIGTERM), with
# turns long enough to be in flight at a sync
ARGS = [
    a
    for a in CI_SIZE
    if not a.startswith(
        ("runner.save_interval=", "algorithm.sampling_params.max_new_tokens=", "agentloop.response_length_total=")
    )
] + [
    "runner.save_interval=-1",
    HF,
    "rollout.return_logprobs=true",
    "runner.max_staleness=1",
    "runner.admission=group",
    "runner.partial_rollout=true",
    "algorithm.sampling_params.max_new_tokens=64",
    "agentloop.response_length_total=256",
    "agentloop.searchr1.tools=[benchmarks.slow_search:SlowSearch]",
    f"runner.max_steps={MAX_STEPS}",
]
SLOW_SEARCH_ENV = {LATENCY_ENV: "300"}


@dataclass
class PreemptedRun:
    out: Path
    run_dir: Path
    overrides: list[str]
    code: int
    log: str
    checkpoint: Path | None
    steps_before_resume: list[int]  # metrics.jsonl's steps after launch 1
    converted_before_resume: bool
    resume_code: int
    resume_log: str


@pytest.fixture(scope="module")
def preempted_run(tiny_assets_registry, tmp_path_factory) -> PreemptedRun:
    tiny_assets = tiny_assets_registry  # tiny-cpu.yaml trains on the registry world
    out = tmp_path_factory.mktemp("hf_async_preempted")
    run_dir = out / "searchr1-grpo-tiny-cpu"
    overrides = [
        f"paths.tiny_assets={tiny_assets.root}",
        f"runner.output_dir={out}",
        f"rollout.model.model_path={tiny_assets.qwen2_tiny}",
        f"runner.rollout_data_dir={out / 'dumps'}",
        *ARGS,
    ]
    args = [*EVAL_OVERRIDES, *overrides]
    launcher = {}

    def keep_proc(_line, proc):
        launcher["proc"] = proc

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | SLOW_SEARCH_ENV
    watch = when_step_logged(run_dir, 1, lambda: launcher["proc"].send_signal(signal.SIGTERM))
    code, log = launch(args, on_line=keep_proc, timeout=420, env=env)
    watch.finish()
    checkpoint = latest_complete_checkpoint(run_dir / "checkpoints")
    steps = [r["step"] for r in metrics_rows(run_dir)]
    converted = (run_dir / "hf_model").exists()
    resume_code, resume_log = launch([*args, "runner.resume_dir=auto"], timeout=600, env=env)
    (out / "launch_1.log").write_text(log)  # kept for a failure's reading (pytest's basetemp)
    (out / "launch_2.log").write_text(resume_log)
    return PreemptedRun(out, run_dir, overrides, code, log, checkpoint, steps, converted, resume_code, resume_log)


def loader_batches(run: PreemptedRun) -> list[list[str]]:
    """The prompt uids of the run's batches, in the order an uninterrupted run trains them."""
    from rlinf_ext.runner.data_order import batch_order
    from rlinf_ext.runner.prepare import build_datasets, load_checked_config

    cfg = load_checked_config("tiny-cpu", run.overrides, check_paths=False)
    train_ds, _ = build_datasets(cfg)
    return [[items["uid"] for items in batch] for _, batch in batch_order(cfg, len(train_ds)).batches(train_ds, 0)][
        :MAX_STEPS
    ]


def dumped(run: PreemptedRun, step: int) -> list[dict]:
    """Step ``step``'s trajectories: group uid ``s<batch>-<k>-<prompt uid>``, reward, per-token versions, ..."""
    return [json.loads(line) for line in (run.out / "dumps" / f"step_{step}.jsonl").read_text().splitlines()]


@pytest.mark.timeout(1200)
def test_sigterm_finishes_the_step_drains_checkpoints_exits_75_and_resume_continues(preempted_run):
    run = preempted_run
    assert run.code == EXIT_PREEMPTED, run.log[-4000:]
    assert "SIGTERM received: finishing the current step" in run.log
    assert "batch(es) in flight after step" in run.log  # read ahead, aborted, discarded
    steps = run.steps_before_resume
    last = steps[-1]
    assert steps == list(range(0, last + 1)) and 1 <= last < MAX_STEPS, steps  # step 0: validation before training
    checkpoint = run.run_dir / "checkpoints" / f"global_step_{last}"  # the step in flight finished and was saved
    assert run.checkpoint == checkpoint and check_complete(checkpoint) is None
    assert f"stopped by SIGTERM after step {last}; checkpoint {checkpoint}" in run.log
    assert not run.converted_before_resume  # no conversion in the grace period

    assert run.resume_code == 0, run.resume_log[-4000:]
    assert f"resumed from {checkpoint}" in run.resume_log
    assert [r["step"] for r in metrics_rows(run.run_dir)] == list(range(0, MAX_STEPS + 1))
    assert (
        latest_complete_checkpoint(run.run_dir / "checkpoints")
        == run.run_dir / "checkpoints" / f"global_step_{MAX_STEPS}"
    )
    # every group trained once and whole: the prompts of the run's first MAX_STEPS batches, across the stop
    trained = Counter(rec["uid"] for step in range(1, MAX_STEPS + 1) for rec in dumped(run, step))
    expected = {f"s{b}-{k:04d}-{uid}" for b, batch in enumerate(loader_batches(run)) for k, uid in enumerate(batch)}
    assert set(trained) == expected and set(trained.values()) == {GROUP}, trained


@pytest.mark.timeout(1200)
def test_tiny_experiment_on_the_hf_fallback_trains_syncs_and_evaluates(preempted_run):
    run = preempted_run
    assert run.resume_code == 0, run.resume_log[-4000:]
    rows = metrics_rows(run.run_dir)
    assert [r["step"] for r in rows] == list(range(MAX_STEPS + 1))  # step 0 once: a resume does not validate again
    assert math.isfinite(rows[0]["time/rollout_start"])  # the engine's start-up, logged once
    # every update reaches the engine: a step syncs unless the validation after the step before already did
    assert all(r["time/sync"] > 0 for prev, r in zip(rows[1:], rows[2:]) if "time/validation" not in prev), rows
    assert all(math.isfinite(r["reward/mean"]) for r in rows[1:])
    assert VLLM_SYNC_LINE not in run.log + run.resume_log  # no vLLM engine anywhere in this run
    results = json.loads((run.run_dir / "eval" / f"global_step_{MAX_STEPS}" / "results.json").read_text())
    # data.data_size=1: one held-out question per data source, the registry world's relations
    assert results["overall"]["n"] == len(RELATIONS) and results["overall"]["errors"] == 0


@pytest.mark.timeout(1200)
def test_one_step_ahead_with_partial_rollout_logs_staleness_within_k_idle_time_and_the_behaviour_weight(preempted_run):
    run = preempted_run
    for row in metrics_rows(run.run_dir)[1:]:
        step = row["step"]
        # no group older than k at its head, no sampled token older than k (partial rollout's bound)
        assert row[mk.STALENESS_HEAD_MAX] <= 1 and row[mk.STALENESS_TOKEN_MAX] <= 1, step
        assert math.isfinite(row[mk.TIME_WAIT_ROLLOUT]) and row[mk.TIME_WAIT_ROLLOUT] >= 0
        assert 0 <= row[mk.TIME_ACTOR_IDLE_RATIO] <= 1 and 0 <= row[mk.TIME_ROLLOUT_IDLE_RATIO] <= 1
        # the decoupled loss weighs each token by pi_prox / pi_behav: the engine's log-probs reached the actor
        assert math.isfinite(row[mk.ACTOR_BEHAVIOUR_WEIGHT_MEAN]) and math.isfinite(row[mk.ACTOR_BEHAVIOUR_KL])
        # every sampled token carries the version that sampled it: the fractions at staleness 0 and 1 add up to 1
        assert math.isclose(row[mk.token_staleness(0)] + row.get(mk.token_staleness(1), 0.0), 1.0), row
        assert 0.0 <= row[mk.TRAJECTORIES_TWO_VERSIONS] <= 1.0
    # a sync landed inside turns: their tokens keep the version that sampled each
    versions = [
        sorted({v for v in rec["versions"] if v >= 0}) for step in range(1, MAX_STEPS + 1) for rec in dumped(run, step)
    ]
    assert any(len(v) == 2 for v in versions), versions
