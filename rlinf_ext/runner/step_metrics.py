"""A training step's metrics, assembled from what the workers returned: the agent's, reward's and actor's
metrics, the step's times, the staleness of what it trained and the idle shares (``runner/staleness.py``), and the
rollout engines' own counters."""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.engines import engine_spec
from rlinf_ext.runner.groups import wait_or_raise
from rlinf_ext.runner.metrics import engine_mismatch_step
from rlinf_ext.runner.pipeline import BatchPipeline, RolledOutBatch
from rlinf_ext.runner.staleness import busy_seconds, head_staleness_metrics, idle_ratios, token_staleness_metrics
from rlinf_ext.workers.returns import AgentLoopOutput

RECORD_VERSIONS = "versions"  # a trajectory record's per-token weight versions (-1 on observation tokens), if any
# the actor's training metrics a step logs as actor/<name>: the mean over its mini-batches (lr: the last one's)
ACTOR_STEP_KEYS = (
    "loss",
    "policy_loss",
    "kl",
    "entropy",
    "grad_norm",
    "lr",
    "clip_fraction",
    "ratio",
    "approx_kl",
    "update_success",
    "advantages_mean",
    "advantages_max",
    "advantages_min",
    *(mk.actor_name(key) for key in mk.ACTOR_BEHAVIOUR_METRICS),
)  # steps weighted by pi_behav


class StepClock:
    """The step's wall clock and its timed parts (``time/<part>`` seconds; a part timed twice adds up)."""

    def __init__(self):
        self.started = time.perf_counter()
        self.parts: dict[str, float] = {}

    def add(self, key: str, seconds: float) -> None:
        self.parts[key] = self.parts.get(key, 0.0) + float(seconds)

    @contextmanager
    def part(self, key: str):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(key, time.perf_counter() - began)


def critic_step_metrics(training: list[dict]) -> dict[str, float]:
    """PPO: the critic's ``critic/...`` metrics of the step (the mean over its mini-batches; absent without a critic)."""
    keys = sorted({key for m in training for key in m if key.startswith(mk.CRITIC_PREFIX + "/")})
    return {key: float(sum(m[key] for m in training) / len(training)) for key in keys}


def outcome_metrics(
    outs: Sequence[AgentLoopOutput], reward_metrics: dict, rollout_metrics: dict, training: list[dict]
) -> dict[str, float]:
    """reward/..., agent/... (trajectory-weighted over the agent-loop ranks), rollout/..., actor/... and critic/..."""
    metrics: dict[str, float] = dict(reward_metrics)
    total = sum(out.num_trajectories for out in outs) or 1
    for key in set().union(*(out.metrics.keys() for out in outs)):
        metrics[key] = sum(out.metrics.get(key, 0.0) * out.num_trajectories for out in outs) / total
    for key, value in rollout_metrics.items():
        metrics[mk.prefixed(mk.ROLLOUT_PREFIX, key)] = float(value)
    last = training[-1]
    for key in ACTOR_STEP_KEYS:
        if key in last:
            metrics[mk.prefixed(mk.ACTOR_PREFIX, key)] = (
                float(sum(m[key] for m in training) / len(training)) if key != "lr" else float(last[key])
            )
    metrics[mk.ACTOR_OPTIMIZER_STEPS] = float(sum("loss" in m for m in training))  # 0 in critic.critic_warmup
    metrics.update(critic_step_metrics(training))
    return metrics


def flow_metrics(
    batch: RolledOutBatch,
    outs: Sequence[AgentLoopOutput],
    trajectories: list[dict],
    clock: StepClock,
    pipeline: BatchPipeline,
) -> dict[str, float]:
    """The step's times, throughput, staleness and idle shares; the rollouts still in ``pipeline``'s flight count
    towards the engines' busy time."""
    ended = time.perf_counter()
    in_flight = pipeline.rollout_intervals(ended)
    step_time = ended - clock.started
    # the agent loop's own clock: RLinf's per-method timer sums the overlapping calls of batches in flight
    time_rollout = max(out.wall_time for out in outs)
    busy = busy_seconds([(batch.dispatched_at, batch.dispatched_at + time_rollout), *in_flight], clock.started, ended)
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in trajectories)
    metrics = head_staleness_metrics(batch.batch, batch.head_versions)
    metrics.update(
        token_staleness_metrics(batch.batch, (rec.get(RECORD_VERSIONS) for rec in trajectories), pipeline.max_staleness)
    )
    metrics.update(idle_ratios(step_time, clock.parts.get(mk.TIME_WAIT_ROLLOUT, 0.0), busy))
    metrics.update(
        {
            mk.TIME_ROLLOUT: float(time_rollout),
            mk.TIME_TOOL: max(out.tool_time for out in outs),
            **clock.parts,
            mk.TIME_STEP: step_time,
            mk.THROUGHPUT_TOKENS_PER_S: tokens / max(step_time, 1e-9),
        }
    )
    return metrics


def engine_counts_mismatches(cfg: Any) -> bool:
    """Whether the rollout engine counts prompts it expanded differently from the agent loop's ids: with images, on
    an engine that expands each image's pads itself (``EngineSpec.recounts_image_pads``: vLLM, SGLang)."""
    return cfg.rollout.model.model_type == "qwen2.5_vl" and engine_spec(cfg).recounts_image_pads


class EngineCounters:
    """The rollout engines' re-tokenisation mismatch rate per step and, after a sync, the probe's log-prob gap."""

    def __init__(self, rollout_group: Any):
        self.rollout_group = rollout_group
        self.seen = (0, 0)  # the engines' (mismatches, prompts) already attributed to a step

    def read(self, synced: bool) -> dict[str, float]:
        """The mismatch rate over the prompts served since the last read (a validation reads and drops its own)."""
        states = wait_or_raise(self.rollout_group.get_state(), "rollout", "get_state")
        rate, self.seen = engine_mismatch_step(states, self.seen)
        out = {} if rate is None else {mk.RETOKENIZE_MISMATCH: rate}
        gaps = [s["last_sync_logprob_gap"] for s in states if s.get("last_sync_logprob_gap") is not None]
        if synced and gaps:
            out[mk.SYNC_LOGPROB_GAP] = float(max(gaps))
        return out
