"""The trainer's ``on_step`` sink (docs/contracts.md, "Runner"): TensorBoard, optional wandb, a progress bar,
per-step trajectory dumps, a metrics jsonl and, at the end, a reward-curve PNG next to the logs.

``MetricsSink(...)(step, metrics, trajectories)`` is called once per training step by the trainer.
``close()`` flushes everything and writes the plot; it is safe to call more than once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol import metric_keys as mk

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "reward_curve.png"
SMOOTHING_WINDOW = 5  # steps in the trailing mean drawn over the per-step reward


# ---------------------------------------------------------------- pure helpers (unit-tested by hand)


def first_last_means(values: Sequence[float], window: int) -> tuple[float, float]:
    """Mean of the first ``window`` and of the last ``window`` finite values.

    ``window`` is clipped to half the number of values so that the two windows never overlap
    (with one value both means are that value). Raises ValueError when there is no finite value.
    """
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        raise ValueError("no finite values to summarise")
    w = max(1, min(int(window), len(finite) // 2 or 1))
    return sum(finite[:w]) / w, sum(finite[-w:]) / w


def engine_mismatch_step(states: Sequence[dict], seen: tuple[int, int]) -> tuple[float | None, tuple[int, int]]:
    """The share of the prompts served since ``seen`` that the rollout engines expanded differently from the
    agent loop's ids, from each rollout rank's cumulative ``RETOKENIZE_COUNTS`` (mismatches, prompts checked);
    returns (that share, or None when no prompt was checked; the new totals, the next call's ``seen``)."""
    counts = [s[mk.RETOKENIZE_COUNTS] for s in states if s.get(mk.RETOKENIZE_COUNTS) is not None]
    totals = (sum(int(c[0]) for c in counts), sum(int(c[1]) for c in counts))
    prompts = totals[1] - seen[1]
    if prompts < 0:  # counters only grow while the engines live
        raise ValueError(f"rollout engines report {totals[1]} prompts checked, fewer than the {seen[1]} seen before")
    return ((totals[0] - seen[0]) / prompts if prompts else None), totals


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values (shorter at the start), one output per input."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def to_jsonable(value: Any) -> Any:
    """Turn tensors, numpy arrays/scalars, dataclasses and paths into plain JSON values."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # torch tensors and numpy arrays / scalars
        return to_jsonable(value.tolist())
    if hasattr(value, "__dataclass_fields__"):
        return to_jsonable(asdict(value))
    return str(value)


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Keep the entries that are numbers (tensors of one element included) as floats."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out


# ---------------------------------------------------------------- wandb (never prompts)


def init_wandb(project: str, experiment: str, log_dir: Path, config: dict | None):
    """Start a wandb run: online only when WANDB_API_KEY is set, offline otherwise; never a login prompt."""
    import wandb

    mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb.init(
        project=project,
        name=experiment,
        dir=str(log_dir),
        mode=mode,
        config=config or {},
        settings=wandb.Settings(console="off", silent=True),
        reinit=True,
    )


# ---------------------------------------------------------------- the sink


@dataclass
class MetricsSink:
    """Per-step logging for one training run.

    log_dir: TensorBoard event files, ``metrics.jsonl`` and ``reward_curve.png`` go here.
    backends: names from ``runner.logger.logger_backends`` (``tensorboard`` is always on; ``wandb`` optional).
    rollout_data_dir: when set, step N's trajectories are written to ``step_N.jsonl`` there.
    total_steps: length of the progress bar (None = unknown).
    """

    log_dir: Path
    backends: Iterable[str] = ("tensorboard",)
    project: str = "rlinf_ext"
    experiment: str = "run"
    rollout_data_dir: Path | None = None
    total_steps: int | None = None
    run_config: dict | None = None
    show_progress: bool = True
    history: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.backends = [b.lower() for b in self.backends]
        unknown = sorted(set(self.backends) - {"tensorboard", "wandb"})
        if unknown:
            raise ValueError(
                f"runner.logger.logger_backends: unknown backend(s) {unknown}; use 'tensorboard' and/or 'wandb'"
            )
        self._tb = SummaryWriter(log_dir=str(self.log_dir / "tensorboard"))
        self._wandb = (
            init_wandb(self.project, self.experiment, self.log_dir, self.run_config)
            if "wandb" in self.backends
            else None
        )
        if self.rollout_data_dir is not None:
            self.rollout_data_dir = Path(self.rollout_data_dir)
            self.rollout_data_dir.mkdir(parents=True, exist_ok=True)
        self._metrics_file = open(self.log_dir / METRICS_FILE, "a", encoding="utf-8")
        self._bar = None
        if self.show_progress:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total_steps, desc="train", unit="step", dynamic_ncols=True)
        self._closed = False
        self.plot_path: Path | None = None

    # the trainer calls this
    def __call__(self, step: int, metrics: dict[str, Any], trajectories: list[dict] | None = None) -> None:
        values = scalar_metrics(metrics)
        for key, value in values.items():
            self._tb.add_scalar(key, value, global_step=step)
        self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=step)
        self._metrics_file.write(json.dumps({"step": step, **to_jsonable(values)}) + "\n")
        self._metrics_file.flush()
        if self.rollout_data_dir is not None and trajectories:  # none at step 0 (validation before training)
            self.dump_trajectories(step, trajectories)
        self.history.append({"step": float(step), **values})
        if self._bar is not None and step > 0:  # the bar counts training steps
            if len(self.history) == 1 and step > 1:  # a resumed run: the bar starts where training starts
                self._bar.n = self._bar.last_print_n = step - 1
            postfix = {k.split("/")[-1]: f"{values[k]:.3f}" for k in (mk.REWARD_MEAN, mk.ACTOR_LOSS) if k in values}
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(1)

    def dump_trajectories(self, step: int, trajectories: list[dict]) -> Path:
        path = self.rollout_data_dir / f"step_{step}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for traj in trajectories:
                f.write(json.dumps({"step": step, **to_jsonable(traj)}, ensure_ascii=False) + "\n")
        os.replace(tmp, path)  # a reader never sees half a step
        return path

    def rewards(self) -> list[float]:
        return [h[mk.REWARD_MEAN] for h in self.history if mk.REWARD_MEAN in h]

    def close(self) -> Path | None:
        """Flush the writers and write the reward curve; returns the PNG path (None if no reward logged)."""
        if self._closed:
            return self.plot_path
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        self._tb.close()
        self._metrics_file.close()
        if self._wandb is not None:
            self._wandb.finish()
        history = read_metrics(self.log_dir / METRICS_FILE)  # whole run, earlier launches included
        if any(mk.REWARD_MEAN in h for h in history):
            self.plot_path = plot_reward_curve(history, self.log_dir / PLOT_FILE, title=self.experiment)
        return self.plot_path

    def __enter__(self) -> "MetricsSink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: Path) -> list[dict[str, float]]:
    """Read ``metrics.jsonl``; on a resumed run a later record for the same step replaces the earlier one."""
    by_step: dict[int, dict] = {}
    if Path(path).exists():
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def plot_reward_curve(history: list[dict], out_path: Path, title: str = "") -> Path:
    """Reward (and EM, and MMSearch-R1's per-category search ratios when logged) per step, written as a PNG with
    the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    # MMSearch-R1 runs add the search ratios and accuracy per category (on the same 0..1 scale)
    for key, label in ((mk.REWARD_MEAN, "mean reward"), (mk.REWARD_EM, "EM"), *mk.MM_TRENDS):
        points = [(h["step"], h[key]) for h in history if key in h and _finite(h[key])]
        if points:
            steps, values = zip(*points)
            (line,) = ax.plot(steps, values, marker="o", markersize=3, alpha=0.5, label=label)
            if len(values) >= 2 * SMOOTHING_WINDOW:  # noisy per-step rewards: show the trend as well
                ax.plot(
                    steps,
                    moving_average(values, SMOOTHING_WINDOW),
                    color=line.get_color(),
                    label=f"{label} ({SMOOTHING_WINDOW}-step mean)",
                )
    ax.set_xlabel("step")
    ax.set_ylabel("reward / ratio")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return Path(out_path)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def sink_from_config(cfg: ExperimentConfig, total_steps: int | None = None, show_progress: bool = True) -> MetricsSink:
    """Build the sink from ``runner.logger`` and ``runner.rollout_data_dir`` of an experiment config."""
    logger = cfg.runner.logger

    run_config = to_jsonable(dataclasses.asdict(cfg)) if dataclasses.is_dataclass(cfg) else None
    return MetricsSink(
        log_dir=Path(logger.log_path),
        backends=list(logger.logger_backends or ["tensorboard"]),
        project=logger.project_name,
        experiment=logger.experiment_name,
        rollout_data_dir=Path(cfg.runner.rollout_data_dir) if cfg.runner.rollout_data_dir else None,
        total_steps=total_steps,
        run_config=run_config,
        show_progress=show_progress,
    )
