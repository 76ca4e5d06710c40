"""`rlinf-ext eval-report RUN_DIR [RUN_DIR ...] [--with-paper] [--metric em|subem|f1]`."""

from __future__ import annotations

import argparse
import sys

from rlinf_ext.eval.searchr1.report import METRICS, render_report


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="evaluation run directories (each holds results.json)"
    )
    parser.add_argument("--with-paper", action="store_true", help="add the published Search-R1 EM rows (paper v5)")
    parser.add_argument("--metric", choices=METRICS, default="em", help="score to tabulate (default: em)")


def run(verb: str, args: argparse.Namespace) -> int:
    try:
        print(render_report(args.run_dirs, metric=args.metric, with_paper=args.with_paper))
    except (FileNotFoundError, ValueError) as exc:
        print(f"rlinf-ext {verb}: {exc}", file=sys.stderr)
        return 1
    return 0
