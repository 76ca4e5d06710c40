"""Bounded-staleness rollout on the tiny Search-R1 experiment: throughput for k = runner.max_staleness, reward
against step and wall-clock, the staleness histogram. Prints figures; writes the curves as a PNG.

    python benchmarks/async_bench.py [--ks 0,1,2] [--latencies-ms 0,500] [--seeds 1] [--curve-seeds 1,2]
                                     [--steps 10] [--assets DIR] [--out DIR] [--png docs/async_curves.png]
                                     [key=value ...]

Not a test: it measures. Each run is the real launcher in its own child process (``rlinf-ext train tiny-cpu
--no-eval``: Ray, the retrieval server, the vLLM rollout, the Megatron actor) from an empty output directory, with
a benchmark-only latency added to every search (``benchmarks/slow_search.py``). Throughput runs: every k x latency
on ``--seeds``; curve runs: k = 0 and 1 at the largest latency on ``--curve-seeds``. Figures per run: wall time of
the training steps (the first step's start to the last step's end, from ``time/step``), trajectories/s, steps/s,
the ratio to k = 0 at the same latency, ``time/wait_rollout`` and the idle ratios, and the fraction of trained
tokens at each staleness.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.slow_search import LATENCY_ENV  # noqa: E402
from rlinf_ext.config import load_config  # noqa: E402
from rlinf_ext.protocol import metric_keys as mk  # noqa: E402

EXPERIMENT = "tiny-cpu"
RUN_NAME = "searchr1-grpo-tiny-cpu"
SLOW_SEARCH = "benchmarks.slow_search:SlowSearch"
STALENESS_PREFIX = "async/token_staleness_"


def parse_list(text: str, kind=int) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


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
                j = int(key[len(STALENESS_PREFIX):])
                staleness[j] = staleness.get(j, 0.0) + float(value)
    total = sum(staleness.values()) or 1.0
    elapsed, clock = [], 0.0
    for r in steps:
        clock += float(r.get(mk.TIME_STEP, 0.0))
        elapsed.append(clock)
    return {
        "steps": len(steps), "wall_s": wall_s, "train_s": train_s,
        "steps_per_s": len(steps) / train_s if train_s else float("nan"),
        "trajectories_per_s": trajectories / train_s if train_s and trajectories else float("nan"),
        "wait_rollout_s": mean("time/wait_rollout"), "actor_idle": mean("time/actor_idle_ratio"),
        "rollout_idle": mean("time/rollout_idle_ratio"), "time_rollout_s": mean(mk.TIME_ROLLOUT),
        "time_train_s": mean(mk.TIME_TRAIN), "staleness": {j: v / total for j, v in sorted(staleness.items())},
        "reward": [float(r[mk.REWARD_MEAN]) for r in steps], "elapsed_s": elapsed,
    }


def launch(out: Path, k: int, latency_ms: int, seed: int, steps: int, assets: Path, overrides: list[str]) -> dict:
    env = {kk: v for kk, v in os.environ.items() if kk != "RAY_ADDRESS"}
    env[LATENCY_ENV] = str(latency_ms)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "rlinf_ext.cli", "train", EXPERIMENT, "--no-progress", "--no-eval",
               f"runner.output_dir={out}", f"paths.tiny_assets={assets}", f"runner.max_steps={steps}",
               f"runner.max_staleness={k}", f"runner.seed={seed}", "runner.val_before_train=false",
               "runner.val_check_interval=0", "runner.save_interval=-1", "rollout.return_logprobs=true",
               f"agentloop.searchr1.tools=[{SLOW_SEARCH}]", *overrides]
    started = time.monotonic()
    log = out / "launcher.log"
    out.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle:
        code = subprocess.call(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
    wall = time.monotonic() - started
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"run k={k} latency={latency_ms} ms seed={seed} failed (exit {code}); {log}:\n{tail}")
    cfg = load_config(EXPERIMENT, command[command.index("--no-eval") + 1:], strict=False)
    return run_figures(read_rows(out / RUN_NAME), wall, cfg.data.rollout_batch_size * cfg.algorithm.group_size)


def throughput_table(results: dict[tuple[int, int, int], dict]) -> str:
    lines = ["| latency (ms) | k | seed | steps | train s | steps/s | trajectories/s | vs k=0 | wait_rollout s | "
             "actor idle | rollout idle | token staleness 0..k |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (latency, k, seed), fig in sorted(results.items()):
        base = results.get((latency, 0, seed))
        ratio = fig["trajectories_per_s"] / base["trajectories_per_s"] if base else float("nan")
        hist = " / ".join(f"{v:.2f}" for v in fig["staleness"].values()) or "-"
        lines.append(f"| {latency} | {k} | {seed} | {fig['steps']} | {fig['train_s']:.1f} | {fig['steps_per_s']:.3f} | "
                     f"{fig['trajectories_per_s']:.2f} | {ratio:.2f}x | {fig['wait_rollout_s']:.2f} | "
                     f"{fig['actor_idle']:.2f} | {fig['rollout_idle']:.2f} | {hist} |")
    return "\n".join(lines)


def plot(curves: dict[tuple[int, int], dict], png: Path, latency_ms: int) -> None:
    import matplotlib  # heavy, only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy, only for plots

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for (k, seed), figures in sorted(curves.items()):
        steps = list(range(1, len(figures["reward"]) + 1))
        style = "-" if k == 0 else "--"
        by_step.plot(steps, figures["reward"], style, label=f"k={k} seed={seed}")
        by_time.plot(figures["elapsed_s"], figures["reward"], style, label=f"k={k} seed={seed}")
    by_step.set(xlabel="training step", ylabel="reward/mean", title="reward per step")
    by_time.set(xlabel="wall-clock of the training steps (s)", ylabel="reward/mean",
                title=f"reward per second (search latency {latency_ms} ms)")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="0,1,2")
    parser.add_argument("--latencies-ms", default="0,500")
    parser.add_argument("--seeds", default="1", help="seeds of the throughput runs")
    parser.add_argument("--curve-seeds", default="1,2", help="seeds of the k=0/k=1 reward curves (largest latency)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--assets", default=os.environ.get("RLINF_EXT_TINY_ASSETS"))
    parser.add_argument("--out", default=None)
    parser.add_argument("--png", default=str(REPO / "docs" / "async_curves.png"))
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    if not args.assets:
        parser.error("--assets DIR (or RLINF_EXT_TINY_ASSETS): tiny assets with the warm start "
                     "(rlinf-ext make-tiny-assets --out DIR --with-registry)")
    out = Path(args.out or tempfile.mkdtemp(prefix="async_bench_"))
    ks, latencies = parse_list(args.ks), parse_list(args.latencies_ms)
    results: dict[tuple[int, int, int], dict] = {}
    for latency in latencies:
        for seed in parse_list(args.seeds):
            for k in ks:
                run_out = out / f"lat{latency}-k{k}-seed{seed}"
                results[(latency, k, seed)] = launch(run_out, k, latency, seed, args.steps, Path(args.assets),
                                                     args.overrides)
                print(f"[async_bench] latency {latency} ms, k={k}, seed {seed}: "
                      f"{results[(latency, k, seed)]['trajectories_per_s']:.2f} trajectories/s", flush=True)
    print("\n" + throughput_table(results))
    top = max(latencies)
    curves = {}
    for seed in parse_list(args.curve_seeds):
        for k in (0, 1):
            figures = results.get((top, k, seed))
            if figures is None:
                figures = launch(out / f"lat{top}-k{k}-seed{seed}", k, top, seed, args.steps, Path(args.assets),
                                 args.overrides)
            curves[(k, seed)] = figures
    print("\n| k | seed | reward per step | elapsed s per step |\n|---|---|---|---|")
    for (k, seed), figures in sorted(curves.items()):
        print(f"| {k} | {seed} | {' '.join(f'{r:.3f}' for r in figures['reward'])} | "
              f"{' '.join(f'{t:.0f}' for t in figures['elapsed_s'])} |")
    plot(curves, Path(args.png), top)
    print(f"\ncurves: {args.png}; runs under {out}")
    (out / "figures.json").write_text(json.dumps({f"{key}": fig for key, fig in
                                                  {**{str(k): v for k, v in results.items()},
                                                   **{f"curve{k}": v for k, v in curves.items()}}.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
