"""Bounded-staleness rollout on the tiny Search-R1 experiment under a slow (optionally long-tailed) search:
throughput, reward against step and wall-clock, idle ratios, per-phase times, staleness and behaviour weights for
each k = runner.max_staleness x runner.admission x runner.partial_rollout. Prints figures; writes the curves as a PNG.

    python benchmarks/async_bench.py [--ks 0,1,2] [--admissions batch,group] [--partial off,on]
                                     [--latency lognormal:median_ms=300,p99_ms=3000 ...] [--backend hf]
                                     [--seeds 1] [--steps 10] [--assets DIR] [--out DIR] [--png FILE]
                                     [key=value ...]

Not a test: it measures. Each run is the real launcher in its own child process (``rlinf-ext train tiny-cpu
--no-eval``: Ray, the retrieval server, the rollout engine of ``--backend``, the Megatron actor; the registry warm
start, which searches) from an empty output directory, with a benchmark-only latency added to every search
(``benchmarks/slow_search.py``; a ``--latency`` without ``seed=`` draws with the run's seed). k = 0 runs once per
latency and seed (batch admission, no partial rollout: the synchronous order, which the others are measured
against); k >= 1 runs every admission x partial. Partial rollout needs a ``--backend`` whose turns a sync can cut
(the engine table: `EngineSpec.partial_rollout`, hf and vllm), so a comparison with it runs every setting there.

``--assets``: a directory of the run's own (an empty one is filled from the tiny-asset cache at the first launch
and reused; a run writes its retrieval index there, so never a cache entry itself).

Figures per run, from ``metrics.jsonl``: train s (the sum of ``time/step``), trajectories/s, the mean reward per step,
reward/s (the reward summed over the trained trajectories per train second: trajectories/s x mean reward), the
ratio to k = 0, the actor and engine idle ratios, the mean per-phase times (``time/rollout``, ``time/wait_rollout``,
``time/train``, ``time/sync``, ``time/tool``, ``time/recompute``), the share of trajectories sampled by two weight
versions, the behaviour-weight statistics and the share of trained tokens at each staleness, and trajectories/s after the first ``--warmup-steps`` steps (at k >= 1 the first
step has nothing to overlap: the pipeline fills once per run). With several
``--seeds``: a second table of medians with the spread (min-max) across seeds. ``--tables a/figures.json
b/figures.json`` prints the tables of earlier invocations merged, launching nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.slow_search import DISTRIBUTION_ENV, LATENCY_ENV, parse_latency  # noqa: E402 (after the repo joins sys.path)
from rlinf_ext.config import load_config  # noqa: E402 (after the repo joins sys.path)
from rlinf_ext.protocol import metric_keys as mk  # noqa: E402 (after the repo joins sys.path)
from rlinf_ext.protocol.engines import engines_with  # noqa: E402 (after the repo joins sys.path)

EXPERIMENT = "tiny-cpu"
RUN_NAME = "searchr1-grpo-tiny-cpu"
SLOW_SEARCH = "benchmarks.slow_search:SlowSearch"
STALENESS_PREFIX = "async/token_staleness_"
DEFAULT_LATENCY = "lognormal:median_ms=300,p99_ms=3000"
PARTIAL_BACKENDS = tuple(engines_with("partial_rollout"))  # the engines whose turns a sync can cut
# per-step means reported per run: (figure, metric key)
STEP_MEANS = (
    ("actor_idle", mk.TIME_ACTOR_IDLE_RATIO),
    ("rollout_idle", mk.TIME_ROLLOUT_IDLE_RATIO),
    ("time_rollout_s", mk.TIME_ROLLOUT),
    ("wait_rollout_s", mk.TIME_WAIT_ROLLOUT),
    ("time_train_s", mk.TIME_TRAIN),
    ("time_sync_s", mk.TIME_SYNC),
    ("time_tool_s", mk.TIME_TOOL),
    ("time_recompute_s", mk.TIME_RECOMPUTE),
    ("two_versions", mk.TRAJECTORIES_TWO_VERSIONS),
    ("behaviour_weight_mean", mk.ACTOR_BEHAVIOUR_WEIGHT_MEAN),
    ("behaviour_clip", mk.ACTOR_BEHAVIOUR_WEIGHT_CLIP_FRACTION),
    ("behaviour_kl", mk.ACTOR_BEHAVIOUR_KL),
)


@dataclass(frozen=True, order=True)
class Setting:
    """One cell of the grid (the seed apart)."""

    latency: str
    k: int
    admission: str = "batch"
    partial: bool = False

    @property
    def baseline(self) -> Setting:
        return Setting(self.latency, 0)

    @property
    def label(self) -> str:
        return f"k={self.k} {self.admission} partial={'on' if self.partial else 'off'}"

    def overrides(self) -> list[str]:
        return [
            f"runner.max_staleness={self.k}",
            f"runner.admission={self.admission}",
            f"runner.partial_rollout={str(self.partial).lower()}",
        ]


def parse_list(text: str, kind=int) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def parse_switch(text: str) -> list[bool]:
    values = {"off": False, "on": True, "false": False, "true": True}
    out = []
    for x in parse_list(text, str):
        if x.strip().lower() not in values:
            raise ValueError(f"--partial {text!r}: {x!r} is neither off nor on; write e.g. --partial off,on.")
        out.append(values[x.strip().lower()])
    return out


def grid(latencies: list[str], ks: list[int], admissions: list[str], partials: list[bool]) -> list[Setting]:
    """k = 0 once per latency (the synchronous order: group admission trains batch b at step b there, and partial
    rollout has nothing to cut); every admission x partial at k >= 1."""
    out = []
    for latency in latencies:
        for k in ks:
            if k == 0:
                out.append(Setting(latency, 0))
                continue
            out.extend(Setting(latency, k, a, p) for a in admissions for p in partials)
    return out


def read_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run_figures(rows: list[dict], wall_s: float, per_step: int) -> dict:
    """The figures of one run from its metrics rows (pure); ``per_step``: trajectories per step."""
    steps = [r for r in rows if int(r.get("step", 0)) > 0 and mk.REWARD_MEAN in r]
    train_s = sum(float(r.get(mk.TIME_STEP, 0.0)) for r in steps)
    trajectories = per_step * len(steps)

    def mean(key: str) -> float:
        values = [float(r[key]) for r in steps if key in r and math.isfinite(float(r[key]))]
        return sum(values) / len(values) if values else float("nan")

    staleness = {}
    for r in steps:
        for key, value in r.items():
            if key.startswith(STALENESS_PREFIX):
                j = int(key[len(STALENESS_PREFIX) :])
                staleness[j] = staleness.get(j, 0.0) + float(value)
    total = sum(staleness.values()) or 1.0
    elapsed, clock = [], 0.0
    for r in steps:
        clock += float(r.get(mk.TIME_STEP, 0.0))
        elapsed.append(clock)
    reward = [float(r[mk.REWARD_MEAN]) for r in steps]
    per_s = trajectories / train_s if train_s and trajectories else float("nan")
    reward_mean = sum(reward) / len(reward) if reward else float("nan")
    return {
        "steps": len(steps),
        "wall_s": wall_s,
        "train_s": train_s,
        "steps_per_s": len(steps) / train_s if train_s else float("nan"),
        "trajectories_per_s": per_s,
        "reward_mean": reward_mean,
        "reward_per_s": per_s * reward_mean,
        **{name: mean(key) for name, key in STEP_MEANS},
        "staleness": {j: v / total for j, v in sorted(staleness.items())},
        "reward": reward,
        "elapsed_s": elapsed,
    }


def with_seed(latency: str, seed: int) -> str:
    """The latency spec of one run: a lognormal without its own seed draws with the run's."""
    parsed = parse_latency(latency)
    return f"{latency},seed={seed}" if parsed.kind == "lognormal" and "seed=" not in latency else latency


def launch(
    out: Path, setting: Setting, seed: int, steps: int, assets: Path, backend: str, overrides: list[str]
) -> dict:
    env = {kk: v for kk, v in os.environ.items() if kk not in ("RAY_ADDRESS", LATENCY_ENV)}
    env[DISTRIBUTION_ENV] = with_seed(setting.latency, seed)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    command = [
        sys.executable,
        "-m",
        "rlinf_ext.cli",
        "train",
        EXPERIMENT,
        "--no-progress",
        "--no-eval",
        f"runner.output_dir={out}",
        f"paths.tiny_assets={assets}",
        f"runner.max_steps={steps}",
        *setting.overrides(),
        f"runner.seed={seed}",
        f"rollout.rollout_backend={backend}",
        "runner.val_before_train=false",
        "runner.val_check_interval=0",
        "runner.save_interval=-1",
        "rollout.return_logprobs=true",
        f"agentloop.searchr1.tools=[{SLOW_SEARCH}]",
        *overrides,
    ]
    started = time.monotonic()
    log = out / "launcher.log"
    out.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle:
        code = subprocess.call(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
    wall = time.monotonic() - started
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(
            f"run {setting.label} latency={setting.latency} seed={seed} failed (exit {code}); {log}:\n{tail}"
        )
    cfg = load_config(EXPERIMENT, command[command.index("--no-eval") + 1 :], strict=False)
    return run_figures(read_rows(out / RUN_NAME), wall, cfg.data.rollout_batch_size * cfg.algorithm.group_size)


def steady_per_s(fig: dict, warmup: int) -> float:
    """Trajectories/s over the steps after the first ``warmup``: at k >= 1 the first step waits for a whole batch
    with nothing to overlap (the pipeline fills), a cost a run pays once, not per step."""
    n, elapsed = fig["steps"], fig["elapsed_s"]
    if warmup <= 0:
        return fig["trajectories_per_s"]
    if n <= warmup or not math.isfinite(fig["trajectories_per_s"]):
        return float("nan")
    per_step = fig["trajectories_per_s"] * fig["train_s"] / n
    return per_step * (n - warmup) / (elapsed[-1] - elapsed[warmup - 1])


def with_steady(results: dict[tuple[Setting, int], dict], warmup: int) -> dict[tuple[Setting, int], dict]:
    return {key: {**fig, "steady_per_s": steady_per_s(fig, warmup)} for key, fig in results.items()}


def ratio(results: dict[tuple[Setting, int], dict], setting: Setting, seed: int, key: str) -> float:
    base = results.get((setting.baseline, seed))
    return results[(setting, seed)][key] / base[key] if base and base[key] else float("nan")


def median_spread(values: list[float]) -> str:
    """``median (min-max)`` over seeds; the median alone for one seed."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "-"
    med = statistics.median(finite)
    return f"{med:.3g}" if len(finite) == 1 else f"{med:.3g} ({min(finite):.3g}-{max(finite):.3g})"


def fmt(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "-"


def throughput_table(results: dict[tuple[Setting, int], dict]) -> str:
    header = (
        "| latency | setting | seed | steps | train s | trajectories/s | vs k=0 | after warm-up | vs k=0 | "
        "reward/step | reward/s | "
        "actor idle | engine idle | rollout s | wait_rollout s | train s/step | sync s | tool s | two versions | "
        "behaviour w mean / clip / kl | token staleness 0..k |"
    )
    lines = [header, "|" + "---|" * 21]
    for (setting, seed), fig in sorted(results.items()):
        hist = " / ".join(f"{v:.2f}" for v in fig["staleness"].values()) or "-"
        behaviour = (
            f"{fmt(fig['behaviour_weight_mean'], 4)} / {fmt(fig['behaviour_clip'], 3)} / {fmt(fig['behaviour_kl'], 5)}"
        )
        lines.append(
            f"| {setting.latency} | {setting.label} | {seed} | {fig['steps']} | {fig['train_s']:.1f} | "
            f"{fmt(fig['trajectories_per_s'])} | {fmt(ratio(results, setting, seed, 'trajectories_per_s'))}x | "
            f"{fmt(fig['steady_per_s'])} | {fmt(ratio(results, setting, seed, 'steady_per_s'))}x | "
            f"{fmt(fig['reward_mean'], 3)} | {fmt(fig['reward_per_s'], 3)} | {fmt(fig['actor_idle'])} | "
            f"{fmt(fig['rollout_idle'])} | {fmt(fig['time_rollout_s'])} | {fmt(fig['wait_rollout_s'])} | "
            f"{fmt(fig['time_train_s'])} | {fmt(fig['time_sync_s'])} | {fmt(fig['time_tool_s'])} | "
            f"{fmt(fig['two_versions'])} | {behaviour} | {hist} |"
        )
    return "\n".join(lines)


def median_table(results: dict[tuple[Setting, int], dict]) -> str:
    """Per setting: the median across seeds with the spread (min-max)."""
    settings = sorted({setting for setting, _ in results})
    header = (
        "| latency | setting | seeds | trajectories/s | vs k=0 | after warm-up | vs k=0 | reward/step | "
        "reward/s | actor idle | "
        "engine idle | two versions | behaviour w mean |"
    )
    lines = [header, "|" + "---|" * 13]
    for setting in settings:
        seeds = sorted(seed for s, seed in results if s == setting)
        cols = {
            key: median_spread([results[(setting, seed)][key] for seed in seeds])
            for key in (
                "trajectories_per_s",
                "steady_per_s",
                "reward_mean",
                "reward_per_s",
                "actor_idle",
                "rollout_idle",
                "two_versions",
                "behaviour_weight_mean",
            )
        }
        ratios = median_spread([ratio(results, setting, seed, "trajectories_per_s") for seed in seeds])
        steady = median_spread([ratio(results, setting, seed, "steady_per_s") for seed in seeds])
        lines.append(
            f"| {setting.latency} | {setting.label} | {len(seeds)} | {cols['trajectories_per_s']} | "
            f"{ratios} | {cols['steady_per_s']} | {steady} | {cols['reward_mean']} | {cols['reward_per_s']} | {cols['actor_idle']} | "
            f"{cols['rollout_idle']} | {cols['two_versions']} | {cols['behaviour_weight_mean']} |"
        )
    return "\n".join(lines)


def plot(results: dict[tuple[Setting, int], dict], png: Path) -> None:
    import matplotlib  # heavy, only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy, only for plots

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for (setting, seed), figures in sorted(results.items()):
        steps = list(range(1, len(figures["reward"]) + 1))
        style = "-" if setting.k == 0 else "--"
        label = f"{setting.label} seed={seed}"
        by_step.plot(steps, figures["reward"], style, label=label)
        by_time.plot(figures["elapsed_s"], figures["reward"], style, label=label)
    by_step.set(xlabel="training step", ylabel="reward/mean", title="reward per step")
    by_time.set(xlabel="wall-clock of the training steps (s)", ylabel="reward/mean", title="reward per second")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def save_results(results: dict[tuple[Setting, int], dict], path: Path) -> None:
    path.write_text(
        json.dumps(
            [{"setting": vars(setting), "seed": seed, **fig} for (setting, seed), fig in sorted(results.items())]
        )
    )


def load_results(paths: list[str]) -> dict[tuple[Setting, int], dict]:
    """The runs of earlier ``figures.json`` files, merged (e.g. seeds measured by separate invocations)."""
    results = {}
    for path in paths:
        for run in json.loads(Path(path).read_text()):
            fig = {k: v for k, v in run.items() if k not in ("setting", "seed")}
            results[(Setting(**run["setting"]), int(run["seed"]))] = fig
    return results


def print_tables(results: dict[tuple[Setting, int], dict], warmup: int) -> None:
    results = with_steady(results, warmup)
    print(f"(after warm-up: trajectories/s over the steps after the first {warmup})")
    print("\n" + throughput_table(results))
    print("\nmedians across seeds (min-max):\n" + median_table(results))
    print("\n| setting | seed | reward per step | elapsed s per step |\n|---|---|---|---|")
    for (setting, seed), figures in sorted(results.items()):
        print(
            f"| {setting.latency} {setting.label} | {seed} | {' '.join(f'{r:.3f}' for r in figures['reward'])} | "
            f"{' '.join(f'{t:.0f}' for t in figures['elapsed_s'])} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="0,1,2")
    parser.add_argument("--admissions", default="batch,group", help="runner.admission values at k >= 1")
    parser.add_argument("--partial", default="off,on", help="runner.partial_rollout values at k >= 1 (off,on)")
    parser.add_argument(
        "--latency",
        action="append",
        default=None,
        help=f"search latency per call, repeatable: ms, fixed:ms=N or lognormal:median_ms=M,p99_ms=P"
        f"[,seed=S] (default {DEFAULT_LATENCY}, seeded by the run's seed)",
    )
    parser.add_argument("--backend", default="hf", help="rollout.rollout_backend of every run")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--assets", default=os.environ.get("RLINF_EXT_TINY_ASSETS"))
    parser.add_argument("--out", default=None)
    parser.add_argument("--png", default=None, help="the reward curves (default: curves.png under the runs' folder)")
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=1,
        help="steps left out of the after-warm-up trajectories/s (the pipeline's fill)",
    )
    parser.add_argument(
        "--tables",
        nargs="+",
        metavar="FIGURES_JSON",
        default=None,
        help="launch nothing: print the tables of earlier runs' figures.json files, merged",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    if args.tables:
        print_tables(load_results(args.tables), args.warmup_steps)
        return 0
    if not args.assets:
        parser.error(
            "--assets DIR (or RLINF_EXT_TINY_ASSETS): tiny assets with the warm start "
            "(rlinf-ext make-tiny-assets --out DIR --with-registry)"
        )
    latencies = args.latency or [DEFAULT_LATENCY]
    for latency in latencies:
        try:
            parse_latency(latency)
        except ValueError as err:
            parser.error(f"--latency: {err}")
    try:
        partials = parse_switch(args.partial)
    except ValueError as err:
        parser.error(str(err))
    if True in partials and args.backend not in PARTIAL_BACKENDS:
        parser.error(
            f"--partial on with --backend {args.backend}: partial rollout runs on "
            f"{', '.join(PARTIAL_BACKENDS)} only; add --backend {PARTIAL_BACKENDS[0]}, or --partial off."
        )
    out = Path(args.out or tempfile.mkdtemp(prefix="async_bench_"))
    settings = grid(latencies, parse_list(args.ks), parse_list(args.admissions, str), partials)
    results: dict[tuple[Setting, int], dict] = {}
    for seed in parse_list(args.seeds):
        for i, setting in enumerate(settings):
            run_out = out / f"run{i}-k{setting.k}-{setting.admission}-partial{int(setting.partial)}-seed{seed}"
            results[(setting, seed)] = launch(
                run_out, setting, seed, args.steps, Path(args.assets), args.backend, args.overrides
            )
            print(
                f"[async_bench] {setting.latency} {setting.label} seed {seed}: "
                f"{results[(setting, seed)]['trajectories_per_s']:.2f} trajectories/s",
                flush=True,
            )
    print_tables(results, args.warmup_steps)
    png = Path(args.png) if args.png else Path(out) / "curves.png"
    plot(results, png)
    print(f"\ncurves: {png}; runs under {out}")
    save_results(results, out / "figures.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
