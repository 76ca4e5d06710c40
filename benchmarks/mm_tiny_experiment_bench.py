"""The whole tiny MMSearch-R1 pipeline on CPU, timed, on one or more rollout engines side by side: assets + warm
start (once, shared), then per engine a greedy evaluation of the warm start, GRPO training (index, retrieval
server, RLinf groups, validation) and a greedy evaluation of the trained model.

    python benchmarks/mm_tiny_experiment_bench.py [--backends vllm,hf] [--assets DIR] [--out DIR] [--keep]
                                                  [key=value ...]

Not a test: it measures. Each engine runs in a child process of its own from an empty output directory (vLLM's
Transformers backend changes transformers' Qwen2.5-VL classes in the process that starts it, so the HF engine
cannot follow it there). Printed per engine: per-step rollout metrics by FVQA category, the first-third vs
last-third means of the run, the validation passes, the greedy evaluation of the warm start beside that of the
trained model; then one table with the engines side by side (wall time of each phase, engine start-up, mean
rollout / sync / step time, the claim's figures) and the ratio of the whole pipeline's time.
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
STEP_KEYS = (
    "reward/mean",
    "rollout/search_free/search_ratio_image",
    "rollout/search_free/accuracy",
    "rollout/search_required/search_ratio_image",
    "rollout/search_required/accuracy",
    "time/step",
)
EVAL_METRICS = ("accuracy", "reward", "search_ratio_image", "search_ratio_any")


# ------------------------------------------------------------------------------------------------ figures (pure)
def pooled(results: dict) -> dict[str, dict[str, float]]:
    """category -> n-weighted means of an eval table's per-source rows (plus 'all')."""
    rows = [r for r in results["rows"] if r["category"] != "all" and r["data_source"] != "all"]
    out = {}
    for category in sorted({r["category"] for r in rows}) + ["all"]:
        part = [r for r in rows if category in ("all", r["category"])]
        n = sum(r["n"] for r in part)
        out[category] = {k: sum(r[k] * r["n"] for r in part) / n for k in EVAL_METRICS}
    return out


def _mean(values) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def timing_figures(rows: list[dict]) -> dict[str, float]:
    """Engine start-up and mean per-step times of one run's ``metrics.jsonl`` rows."""
    steps = [r for r in rows if int(r["step"]) > 0]
    return {
        "rollout_start_s": next((r[mk.TIME_ROLLOUT_START] for r in rows if mk.TIME_ROLLOUT_START in r), math.nan),
        "rollout_s": _mean(r.get(mk.TIME_ROLLOUT) for r in steps),
        "sync_s": _mean(r[mk.TIME_SYNC] for r in steps if mk.TIME_SYNC in r),
        "step_s": _mean(r.get(mk.TIME_STEP) for r in steps),
        "retokenize_mismatch": _mean(r.get(mk.RETOKENIZE_MISMATCH) for r in steps),
    }


SIDE_ROWS = (  # (label, getter, format)
    ("warm-start evaluation (s)", lambda f: f["times"]["warm_eval_s"], "{:.0f}"),
    ("training + evaluation (s)", lambda f: f["times"]["train_eval_s"], "{:.0f}"),
    ("rollout engine start-up (s)", lambda f: f["timing"]["rollout_start_s"], "{:.1f}"),
    ("rollout per step, mean (s)", lambda f: f["timing"]["rollout_s"], "{:.2f}"),
    ("weight sync per step, mean (s)", lambda f: f["timing"]["sync_s"], "{:.2f}"),
    ("training step, mean (s)", lambda f: f["timing"]["step_s"], "{:.2f}"),
    ("engine expansion mismatch, mean", lambda f: f["timing"]["retokenize_mismatch"], "{:.3f}"),
    ("greedy search_free image search, warm", lambda f: f["warm"]["search_free"]["search_ratio_image"], "{:.3f}"),
    ("greedy search_free image search, trained", lambda f: f["trained"]["search_free"]["search_ratio_image"], "{:.3f}"),
    ("greedy accuracy, warm", lambda f: f["warm"]["all"]["accuracy"], "{:.3f}"),
    ("greedy accuracy, trained", lambda f: f["trained"]["all"]["accuracy"], "{:.3f}"),
)


def side_by_side(figures: dict[str, dict], assets_s: float) -> str:
    """One row per figure, one column per engine; the whole pipeline counts the shared assets once per engine."""
    names = list(figures)
    lines = [f"{'':<42}" + "".join(f"{n:>10}" for n in names)]
    for label, get, fmt in SIDE_ROWS:
        lines.append(f"{label:<42}" + "".join(f"{fmt.format(get(figures[n])):>10}" for n in names))
    whole = {n: assets_s + sum(figures[n]["times"].values()) for n in names}
    lines.append(
        f"{'whole pipeline incl. assets ' + f'{assets_s:.0f} s':<42}" + "".join(f"{whole[n]:>10.0f}" for n in names)
    )
    if len(names) >= 2:
        a, b = names[0], names[1]
        lines.append(
            f"whole pipeline {b} / {a}: {whole[b] / whole[a]:.2f}x; training + evaluation "
            f"{b} / {a}: {figures[b]['times']['train_eval_s'] / figures[a]['times']['train_eval_s']:.2f}x"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ one engine
def run_one(backend: str, assets: Path, out: Path, overrides: list[str], result: Path) -> int:
    """The pipeline after the assets on one engine, in this process (the child's side); figures to ``result``."""
    from rlinf_ext.runner.launch import run_evaluation_only, run_training
    from rlinf_ext.runner.metrics import METRICS_FILE, read_metrics

    engine = f"rollout.rollout_backend={backend}"
    times: dict[str, float] = {}
    t = time.monotonic()
    before = run_evaluation_only(
        "tiny-mm-cpu-eval",
        [f"paths.tiny_assets={assets}", f"runner.output_dir={out}/eval-warm", engine],
        show_progress=False,
    )
    times["warm_eval_s"] = time.monotonic() - t
    t = time.monotonic()
    summary = run_training(
        "tiny-mm-cpu",
        [f"paths.tiny_assets={assets}", f"runner.output_dir={out}", engine, *overrides],
        show_progress=False,
        evaluate=True,
        eval_overrides=[engine],
    )
    times["train_eval_s"] = time.monotonic() - t

    rows = read_metrics(summary.log_dir / METRICS_FILE)
    print(f"\n[{backend}] step  " + "  ".join(k.removeprefix("rollout/") for k in STEP_KEYS))
    for r in (r for r in rows if int(r["step"]) > 0):
        print(
            f"[{backend}] {int(r['step']):>4}  "
            + "  ".join(f"{r.get(k, float('nan')):>{len(k.removeprefix('rollout/'))}.3f}" for k in STEP_KEYS)
        )
    k = summary.reward_window
    print(
        f"[{backend}] first {k} vs last {k} step(s): mean reward {summary.first_reward:.3f} -> {summary.last_reward:.3f}"
    )
    for label, first, last in summary.trends:
        print(f"[{backend}]   {label}: {first:.3f} -> {last:.3f} ({last - first:+.3f})")
    for line in summary.agent_lines:
        print(f"[{backend}] {line}")
    warm = pooled(json.loads((Path(before.run_dir) / "results.json").read_text()))
    trained = pooled(json.loads(summary.eval_table.with_suffix(".json").read_text()))
    print(f"[{backend}] greedy evaluation on the test split (warm start -> trained):")
    for category in warm:
        w, tr = warm[category], trained[category]
        print(f"[{backend}]   {category:<16} " + "  ".join(f"{m} {w[m]:.3f} -> {tr[m]:.3f}" for m in w))
    result.write_text(json.dumps({"times": times, "timing": timing_figures(rows), "warm": warm, "trained": trained}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = engine_run_parser(__doc__.splitlines()[0], "vllm,hf")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="training YAML overrides")
    args = parser.parse_args(argv)

    if args.run_one:
        return run_one(args.run_one, Path(args.assets), Path(args.out), args.overrides, Path(args.result))

    backends = parse_backends(args.backends, BACKENDS)
    out = fresh_out_dir(args.out, "mm_bench_")
    if backends is None or out is None:
        return 2
    assets = Path(args.assets or os.environ.get("RLINF_EXT_TINY_ASSETS") or out / "assets").resolve()
    assets_s = build_assets(assets, "--with-mm", "--with-mm-sft")
    print(f"tiny assets: {assets} ({assets_s:.0f} s, reused when already built)", flush=True)
    figures = run_engines(
        Path(__file__).resolve(),
        backends,
        out,
        lambda backend, run_out: ["--assets", str(assets), "--out", str(run_out), *args.overrides],
    )
    if isinstance(figures, int):
        return figures
    print(f"\n{side_by_side(figures, assets_s)}")
    if not args.out and not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
