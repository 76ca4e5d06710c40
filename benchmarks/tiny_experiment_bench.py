"""Run the whole tiny CPU experiment once and print first/last-step mean reward and the wall time.

    python benchmarks/tiny_experiment_bench.py [--out DIR] [--keep] [key=value ...]

Not a test: it measures. Each run starts from an empty output directory (a temporary one unless --out is
given) so no checkpoint is resumed; the tiny assets are reused from $RLINF_EXT_TINY_ASSETS or generated.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny-cpu", help="experiment YAML (default tiny-cpu)")
    parser.add_argument("--out", help="output root (default: a fresh temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary output directory")
    parser.add_argument("--no-eval", action="store_true", help="skip the evaluation of the converted model")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)

    from rlinf_ext.runner.errors import LaunchError
    from rlinf_ext.runner.launch import run_training
    from rlinf_ext.runner.metrics import METRICS_FILE, read_metrics

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tiny_bench_"))
    if out.exists() and any(out.iterdir()):
        print(f"--out {out} is not empty; give an empty or new directory (a run there would resume)", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        summary = run_training(args.config, [f"runner.output_dir={out}", *args.overrides], show_progress=False,
                               evaluate=False if args.no_eval else None)
    except LaunchError as exc:
        print(f"tiny experiment failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the launcher stopped everything it started", file=sys.stderr)
        return 130
    wall = time.monotonic() - started
    all_rows = read_metrics(summary.log_dir / METRICS_FILE)
    rows = [r for r in all_rows if int(r["step"]) > 0]  # step 0 is the validation before training
    validations = [(int(r["step"]), r) for r in all_rows if "val/all/em" in r]
    print("\nstep  reward/mean  reward/em  searches  search_failures  time/step")
    for r in rows:
        print(f"{int(r['step']):>4}  {r.get('reward/mean', float('nan')):>11.3f}  {r.get('reward/em', float('nan')):>9.3f}"
              f"  {r.get('agent/searches', float('nan')):>8.2f}  {r.get('agent/search_failures', float('nan')):>15.0f}"
              f"  {r.get('time/step', float('nan')):>9.1f}")
    first_step = rows[0].get("reward/mean") if rows else None
    last_step = rows[-1].get("reward/mean") if rows else None
    print(f"\nfirst step reward      : {first_step}")
    print(f"last step reward       : {last_step}")
    k = summary.reward_window
    print(f"mean of first {k} step(s): {summary.first_reward}")
    print(f"mean of last {k} step(s) : {summary.last_reward}")
    if summary.searches is not None:
        print(f"searches per trajectory: first {k} step(s) {summary.searches[0]:.2f}, last {k} {summary.searches[1]:.2f}")
    print(f"steps                  : {summary.steps}")
    print(f"wall time (whole run)  : {wall:.0f} s")
    for step, r in validations:
        print(f"validation at step {step:<3}: greedy EM {r['val/all/em']:.3f} over {int(r['val/n'])} test questions "
              f"(avg over benchmarks {r['val/avg/em']:.3f})")
    if summary.eval_table is not None:
        print(f"eval table             : {summary.eval_table}")
    if not args.out and not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
