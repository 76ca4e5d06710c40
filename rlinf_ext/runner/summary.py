"""The run summary printed at the end of ``rlinf-ext train``: where everything is, and the trends of the run read
back from ``metrics.jsonl`` (mean reward and searches per trajectory over the first vs the last steps, the agent's
own trends, validation EM per pass) plus the lines the agent adds (``AgentSpec.summary``, e.g. MMSearch-R1's
validation per FVQA category)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.agents import agent_spec
from rlinf_ext.runner.metrics import METRICS_FILE, PLOT_FILE, first_last_means, read_metrics

# how many steps at each end of the run the "first vs last mean reward" averages over (at most; a third of
# the run when shorter): one step's mean over 32 trajectories swings by +-0.1 with the prompts it drew
REWARD_SUMMARY_WINDOW = 10


@dataclass
class RunSummary:
    """What a finished run produced; printed at the end and returned to callers (tests, benchmark)."""

    experiment: str
    steps: int = 0
    first_reward: float | None = None
    last_reward: float | None = None
    checkpoint_dir: Path | None = None
    hf_model_dir: Path | None = None
    log_dir: Path | None = None
    plot_path: Path | None = None
    rollout_data_dir: Path | None = None
    eval_table: Path | None = None
    resumed_from: Path | None = None  # the checkpoint this launch started from
    wall_time_s: float = 0.0
    reward_window: int = REWARD_SUMMARY_WINDOW  # steps averaged at each end for first/last reward
    validations: list[tuple[int, float, int]] = field(default_factory=list)  # (step, val/all/em, val/n)
    searches: tuple[float, float] | None = None  # mean searches per trajectory, first vs last window
    trends: list[tuple[str, float, float]] = field(default_factory=list)  # the agent's (label, first, last)
    agent_lines: list[str] = field(default_factory=list)  # what the agent adds (AgentSpec.summary)
    extra: dict[str, Any] = field(default_factory=dict)

    def format(self) -> str:
        def show(p):
            return str(p) if p else "(none)"

        lines = [
            "=" * 78,
            f"[launch] run '{self.experiment}' finished: {self.steps} step(s) in {self.wall_time_s:.0f} s",
        ]
        if self.resumed_from is not None:
            lines.append(f"  resumed from {self.resumed_from}; trends below cover the whole run (metrics.jsonl)")
        if self.first_reward is not None:
            delta = self.last_reward - self.first_reward
            k = self.reward_window
            lines.append(
                f"  mean reward, first {k} vs last {k} step(s): "
                f"{self.first_reward:.3f} -> {self.last_reward:.3f} ({delta:+.3f})"
            )
        if self.searches is not None:
            lines.append(f"  searches per trajectory, same steps: {self.searches[0]:.2f} -> {self.searches[1]:.2f}")
        for label, first, last in self.trends:
            lines.append(f"  {label}, same steps: {first:.3f} -> {last:.3f} ({last - first:+.3f})")
        if self.validations:
            points = ", ".join(f"step {step}: {em:.3f}" for step, em, _ in self.validations)
            lines.append(f"  validation EM (greedy, {self.validations[-1][2]} test questions): {points}")
        lines += [f"  {line}" for line in self.agent_lines]
        lines += [
            f"  checkpoint       : {show(self.checkpoint_dir)}",
            f"  converted HF     : {show(self.hf_model_dir)}",
            f"  logs (TB, jsonl) : {show(self.log_dir)}",
            f"  reward plot      : {show(self.plot_path)}",
            f"  trajectories     : {show(self.rollout_data_dir)}",
            f"  eval table       : {show(self.eval_table)}",
            "=" * 78,
        ]
        return "\n".join(lines)


def reward_window(n_steps: int, window: int = REWARD_SUMMARY_WINDOW) -> int:
    """Steps averaged at each end: ``window``, at most a third of the run (so the two windows are apart)."""
    return max(1, min(window, n_steps // 3 or 1))


def run_rows(log_dir: Path, last_step: int | None = None) -> list[dict]:
    """metrics.jsonl of the whole run (every launch), one row per step; with ``last_step``, rows past it are
    left out (an earlier launch that crashed after its last checkpoint logged steps this run redid or never
    reached)."""
    rows = read_metrics(Path(log_dir) / METRICS_FILE)
    return [r for r in rows if last_step is None or int(r["step"]) <= last_step]


def metric_trend(
    log_dir: Path, key: str, window: int = REWARD_SUMMARY_WINDOW, last_step: int | None = None
) -> tuple[int, float | None, float | None]:
    """(training steps logged, mean of ``key`` over the first ``reward_window`` steps, over the last) from
    metrics.jsonl; the means are None when no step logged ``key``."""
    # step 0 is the validation before training (no reward): not a training step
    rows = [r for r in run_rows(log_dir, last_step) if int(r["step"]) > 0]
    values = [r[key] for r in rows if key in r]
    if not values:
        return len(rows), None, None
    first, last = first_last_means(values, reward_window(len(values), window))
    return len(rows), first, last


def reward_trend(
    log_dir: Path, window: int = REWARD_SUMMARY_WINDOW, last_step: int | None = None
) -> tuple[int, float | None, float | None]:
    """(steps logged, mean reward of the first ``window`` steps, of the last ``window`` steps) from metrics.jsonl."""
    return metric_trend(log_dir, mk.REWARD_MEAN, window, last_step)


def validation_trend(log_dir: Path, last_step: int | None = None) -> list[tuple[int, float, int]]:
    """``(step, val/all/em, val/n)`` of every validation pass logged in metrics.jsonl, in step order."""
    rows = run_rows(log_dir, last_step)
    return [(int(r["step"]), float(r[mk.VAL_ALL_EM]), int(r.get(mk.VAL_N, 0))) for r in rows if mk.VAL_ALL_EM in r]


def fill_from_logs(summary: RunSummary, cfg: ExperimentConfig, last_step: int | None = None) -> None:
    """Logs, plot, trajectory dumps and the reward / search / validation trends of the whole run (every launch
    up to ``last_step``), from its log dir."""
    summary.log_dir = Path(cfg.runner.logger.log_path)
    plot = summary.log_dir / PLOT_FILE
    summary.plot_path = plot if plot.exists() else None
    summary.rollout_data_dir = Path(cfg.runner.rollout_data_dir) if cfg.runner.rollout_data_dir else None
    summary.steps, summary.first_reward, summary.last_reward = reward_trend(summary.log_dir, last_step=last_step)
    summary.reward_window = reward_window(summary.steps)
    _, first_searches, last_searches = metric_trend(summary.log_dir, mk.AGENT_SEARCHES, last_step=last_step)
    if first_searches is not None:
        summary.searches = (first_searches, last_searches)
    summary.validations = validation_trend(summary.log_dir, last_step)
    spec = agent_spec(cfg)
    for key, label in spec.summary_trends:
        _, first, last = metric_trend(summary.log_dir, key, last_step=last_step)
        if first is not None:
            summary.trends.append((label, first, last))
    if spec.has("summary"):
        summary.agent_lines = list(spec.load("summary")(run_rows(summary.log_dir, last_step)))
