"""Run the whole tiny CPU experiment on one or more rollout engines and print their figures side by side.

    python benchmarks/tiny_experiment_bench.py [--backends vllm,hf] [--assets DIR] [--out DIR] [--keep]
                                               [--no-eval] [key=value ...]

Not a test: it measures. The tiny assets (with the warm start) are built once, in a child process, and shared by
every engine's run ($RLINF_EXT_TINY_ASSETS or --assets when given, else under the output directory). Each engine
then runs the whole pipeline (launcher, Ray, retrieval server, training, conversion, evaluation) in its own child
process from an empty output directory, so no checkpoint is resumed and no engine starts beside the numba the
asset generator loads (an in-process vLLM engine cannot). Printed per engine: the pipeline's wall time, the
rollout engine's start-up (``time/rollout_start``) and its parts (``time/rollout_start/<part>``), the weight sync
of every step that synced and its mean and rollout time per step, the mean
reward and searches per trajectory over the first vs the last 10 steps, and the greedy validation EM before
training and after the last step.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.engine_runs import (  # noqa: E402
    build_assets,
    engine_run_parser,
    fresh_out_dir,
    parse_backends,
    run_engines,
)
from rlinf_ext.protocol import metric_keys as mk  # noqa: E402

BACKENDS = ("vllm", "hf")
WINDOW = 10  # steps averaged at each end (as the run summary's REWARD_SUMMARY_WINDOW)


# ------------------------------------------------------------------------------------------------ figures (pure)
def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def run_figures(rows: list[dict], wall_s: float, window: int = WINDOW) -> dict:
    """The figures of one run from its ``metrics.jsonl`` rows (step 0: the validation before training)."""
    steps = [r for r in rows if int(r["step"]) > 0 and mk.REWARD_MEAN in r]
    k = max(1, min(window, len(steps) // 2)) if steps else 0
    vals = [r for r in rows if mk.VAL_ALL_EM in r]
    start = next((r[mk.TIME_ROLLOUT_START] for r in rows if mk.TIME_ROLLOUT_START in r), float("nan"))
    part_prefix = mk.prefixed(mk.TIME_ROLLOUT_START, "")
    parts = next(
        (
            {k[len(part_prefix) :]: v for k, v in r.items() if k.startswith(part_prefix)}
            for r in rows
            if mk.TIME_ROLLOUT_START in r
        ),
        {},
    )
    syncs = [r[mk.TIME_SYNC] for r in steps if mk.TIME_SYNC in r]
    first, last = steps[:k], steps[-k:] if k else []
    return {
        "steps": len(steps),
        "window": k,
        "wall_s": wall_s,
        "rollout_start_s": start,
        "start_parts": parts,  # the engine's start-up parts (vLLM: tokenizer, import, config, engine)
        "sync_s": _mean(syncs),  # steps that synced
        "sync_per_step": syncs,
        "rollout_s": _mean([r.get(mk.TIME_ROLLOUT) for r in steps]),
        "step_s": _mean([r.get(mk.TIME_STEP) for r in steps]),
        "reward_first": _mean([r[mk.REWARD_MEAN] for r in first]),
        "reward_last": _mean([r[mk.REWARD_MEAN] for r in last]),
        "searches_first": _mean([r.get(mk.AGENT_SEARCHES) for r in first]),
        "searches_last": _mean([r.get(mk.AGENT_SEARCHES) for r in last]),
        "val_em_before": vals[0][mk.VAL_ALL_EM] if vals and int(vals[0]["step"]) == 0 else float("nan"),
        "val_em_after": vals[-1][mk.VAL_ALL_EM] if vals and int(vals[-1]["step"]) > 0 else float("nan"),
        "val_n": int(vals[-1][mk.VAL_N]) if vals else 0,
    }


ROWS = (  # (label, key, format)
    ("whole pipeline (s)", "wall_s", "{:.0f}"),
    ("rollout engine start-up (s)", "rollout_start_s", "{:.1f}"),
    ("weight sync per step, mean (s)", "sync_s", "{:.2f}"),
    ("rollout per step, mean (s)", "rollout_s", "{:.1f}"),
    ("training step, mean (s)", "step_s", "{:.1f}"),
    ("reward, first {k} steps", "reward_first", "{:.3f}"),
    ("reward, last {k} steps", "reward_last", "{:.3f}"),
    ("searches/trajectory, first {k}", "searches_first", "{:.2f}"),
    ("searches/trajectory, last {k}", "searches_last", "{:.2f}"),
    ("greedy val EM before training", "val_em_before", "{:.3f}"),
    ("greedy val EM after last step", "val_em_after", "{:.3f}"),
)


def side_by_side(figures: dict[str, dict]) -> str:
    """A plain-text table: one row per figure, one column per engine (+ the ratio of the first two engines' wall
    and rollout times)."""
    names = list(figures)
    k = next(iter(figures.values()))["window"] if figures else WINDOW
    lines = [f"{'':<34}" + "".join(f"{n:>12}" for n in names)]
    part_names = list(dict.fromkeys(p for n in names for p in figures[n].get("start_parts", {})))
    for label, key, fmt in ROWS:
        lines.append(f"{label.format(k=k):<34}" + "".join(f"{fmt.format(figures[n][key]):>12}" for n in names))
        if key == "rollout_start_s":  # its parts, where the engine reports them
            for part in part_names:
                lines.append(
                    f"{'  start-up: ' + part + ' (s)':<34}"
                    + "".join(f"{figures[n].get('start_parts', {}).get(part, float('nan')):>12.1f}" for n in names)
                )
    if len(names) >= 2:
        a, b = figures[names[0]], figures[names[1]]
        for label, key in (("whole pipeline", "wall_s"), ("rollout per step", "rollout_s")):
            lines.append(f"{label} {names[1]} / {names[0]}: {b[key] / a[key]:.2f}x")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ one engine
def run_one(backend: str, out: Path, overrides: list[str], no_eval: bool, result: Path) -> int:
    """One whole pipeline in this process (the child's side); the figures go to ``result`` as JSON."""
    from rlinf_ext.runner.errors import LaunchError
    from rlinf_ext.runner.launch import run_training
    from rlinf_ext.runner.metrics import METRICS_FILE, read_metrics

    started = time.monotonic()
    try:
        summary = run_training(
            "tiny-cpu",
            [f"runner.output_dir={out}", f"rollout.rollout_backend={backend}", *overrides],
            show_progress=False,
            evaluate=False if no_eval else None,
            eval_overrides=[f"rollout.rollout_backend={backend}"],
        )
    except LaunchError as exc:
        print(f"tiny experiment on {backend} failed: {exc}", file=sys.stderr)
        return 1
    wall = time.monotonic() - started
    rows = read_metrics(summary.log_dir / METRICS_FILE)
    figures = run_figures(rows, wall)
    figures["eval_table"] = str(summary.eval_table) if summary.eval_table else None
    result.write_text(json.dumps(figures))
    print(f"\n[{backend}] step  reward/mean  searches  time/rollout  time/sync  time/step")
    for r in rows:
        if mk.REWARD_MEAN in r:
            print(
                f"[{backend}] {int(r['step']):>4}  {r[mk.REWARD_MEAN]:>11.3f}  {r.get(mk.AGENT_SEARCHES, math.nan):>8.2f}"
                f"  {r.get(mk.TIME_ROLLOUT, math.nan):>12.1f}  {r.get(mk.TIME_SYNC, math.nan):>9.2f}"
                f"  {r.get(mk.TIME_STEP, math.nan):>9.1f}"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = engine_run_parser(__doc__.splitlines()[0], "vllm")
    parser.add_argument("--no-eval", action="store_true", help="skip the evaluation of the converted model")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)

    if args.run_one:
        return run_one(args.run_one, Path(args.out), args.overrides, args.no_eval, Path(args.result))

    backends = parse_backends(args.backends, BACKENDS)
    out = fresh_out_dir(args.out, "tiny_bench_")
    if backends is None or out is None:
        return 2
    assets = Path(args.assets or os.environ.get("RLINF_EXT_TINY_ASSETS") or out / "assets").resolve()
    assets_s = build_assets(assets, "--with-registry")
    print(f"tiny assets: {assets} ({assets_s:.0f} s, reused when already built)", flush=True)
    figures = run_engines(
        Path(__file__).resolve(),
        backends,
        out,
        lambda backend, run_out: [
            "--out",
            str(run_out),
            *(["--no-eval"] if args.no_eval else []),
            f"paths.tiny_assets={assets}",
            *args.overrides,
        ],
    )
    if isinstance(figures, int):
        return figures
    print(f"\n{side_by_side(figures)}")
    for backend, fig in figures.items():
        print(f"weight sync per step ({backend}, s): " + " ".join(f"{s:.2f}" for s in fig.get("sync_per_step", [])))
    for backend, fig in figures.items():
        if fig.get("eval_table"):
            print(f"eval table ({backend}): {fig['eval_table']}")
    if not args.out and not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
