"""The whole tiny MMSearch-R1 pipeline on CPU, timed: assets + warm start, greedy evaluation of the warm start,
GRPO training (index, retrieval server, RLinf groups), greedy evaluation of the trained model.

    python benchmarks/mm_tiny_experiment_bench.py [--assets DIR] [--out DIR] [key=value ...]

Not a test: it measures. Prints per-step rollout metrics by FVQA category, the first-third vs last-third means
of the run (image-search ratio on search_free, accuracy on search_required, reward), the greedy evaluation of
the warm start beside that of the trained model, and the wall time of each phase. Assets are generated into
--assets (or a fresh temporary directory: the full pipeline) unless they are already there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEP_KEYS = ("reward/mean", "rollout/search_free/search_ratio_image", "rollout/search_free/accuracy",
             "rollout/search_required/search_ratio_image", "rollout/search_required/accuracy", "time/step")


def pooled(results: Path) -> dict[str, dict[str, float]]:
    """category -> n-weighted means of the eval table's per-source rows (plus 'all')."""
    rows = [r for r in json.loads(results.read_text())["rows"] if r["category"] != "all" and r["data_source"] != "all"]
    out = {}
    for category in sorted({r["category"] for r in rows}) + ["all"]:
        part = [r for r in rows if category in ("all", r["category"])]
        n = sum(r["n"] for r in part)
        out[category] = {k: sum(r[k] * r["n"] for r in part) / n for k in ("accuracy", "reward", "search_ratio_image",
                                                                          "search_ratio_any")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assets", help="tiny assets directory (generated there when missing; default: temporary)")
    parser.add_argument("--out", help="output root (default: a fresh temporary directory)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="training YAML overrides")
    args = parser.parse_args(argv)

    from rlinf_ext.assets.core.tiny import make_tiny_assets
    from rlinf_ext.runner.launch import run_evaluation_only, run_training
    from rlinf_ext.runner.metrics import METRICS_FILE, read_metrics

    scratch = Path(tempfile.mkdtemp(prefix="mm_bench_"))
    assets = Path(args.assets) if args.assets else scratch / "assets"
    out = Path(args.out) if args.out else scratch / "runs"
    times: dict[str, float] = {}
    t = time.monotonic()
    make_tiny_assets(assets, seed=0, with_mm=True, with_mm_sft=True)
    times["assets + warm start"] = time.monotonic() - t
    t = time.monotonic()
    before = run_evaluation_only("tiny-mm-cpu-eval", [f"paths.tiny_assets={assets}", f"runner.output_dir={out}/eval-warm"],
                                 show_progress=False)
    times["evaluation of the warm start"] = time.monotonic() - t
    t = time.monotonic()
    summary = run_training("tiny-mm-cpu", [f"paths.tiny_assets={assets}", f"runner.output_dir={out}", *args.overrides],
                           show_progress=False, evaluate=True)
    times["training + evaluation of the trained model"] = time.monotonic() - t

    rows = [r for r in read_metrics(summary.log_dir / METRICS_FILE) if int(r["step"]) > 0]
    print("\nstep  " + "  ".join(k.removeprefix("rollout/") for k in STEP_KEYS))
    for r in rows:
        print(f"{int(r['step']):>4}  " + "  ".join(f"{r.get(k, float('nan')):>{len(k.removeprefix('rollout/'))}.3f}"
                                                  for k in STEP_KEYS))
    k = summary.reward_window
    print(f"\nfirst {k} vs last {k} step(s) (a third of the run at most):")
    print(f"  mean reward: {summary.first_reward:.3f} -> {summary.last_reward:.3f}")
    for label, first, last in summary.mm_trends:
        print(f"  {label}: {first:.3f} -> {last:.3f} ({last - first:+.3f})")
    warm, trained = pooled(Path(before.run_dir) / "results.json"), pooled(summary.eval_table.with_suffix(".json"))
    print("\ngreedy evaluation on the test split (warm start -> trained):")
    for category in warm:
        w, tr = warm[category], trained[category]
        print(f"  {category:<16} " + "  ".join(f"{m} {w[m]:.3f} -> {tr[m]:.3f}" for m in w))
    print("\nwall time:")
    for phase, seconds in times.items():
        print(f"  {phase:<44} {seconds:7.0f} s")
    print(f"  {'whole pipeline':<44} {sum(times.values()):7.0f} s")
    if not args.out and not args.assets:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
