"""`rlinf-ext train CONFIG [key=value ...]` and `rlinf-ext eval CONFIG [key=value ...]`."""

from __future__ import annotations

import argparse
import sys

EXIT_INTERRUPTED = 130
# SIGTERM while training: the step finished and a checkpoint was written (sysexits' EX_TEMPFAIL: "try again");
# a cluster script requeues on it and the rerun resumes (runner.resume_dir=auto)
EXIT_PREEMPTED = 75


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    what = "experiment" if verb == "train" else "evaluation"
    parser.add_argument(
        "config",
        help=f"{what} YAML: a path, or a name under examples/searchr1/config/ or examples/mmsearch/config/ (e.g. "
        f"{'tiny-cpu' if verb == 'train' else 'tiny-cpu-eval'})",
    )
    # REMAINDER: options may come before or after the overrides (argparse cannot intermix them otherwise)
    parser.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        metavar="key=value",
        help="dotted overrides applied after the YAML, e.g. runner.max_steps=4 actor.optim.lr=1e-5",
    )
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars (line-oriented logs)")
    if verb == "train":
        parser.add_argument(
            "--eval",
            dest="evaluate",
            action="store_true",
            default=None,
            help="evaluate the converted model with the sibling -eval YAML (default: only for the tiny experiment)",
        )
        parser.add_argument("--no-eval", dest="evaluate", action="store_false", help="skip the evaluation")
        parser.add_argument(
            "--eval-override",
            action="append",
            default=None,
            metavar="key=value",
            help="override for the evaluation YAML (repeatable), e.g. data.data_size=4",
        )


def pull_flags(args: argparse.Namespace, rest: list[str]) -> list[str]:
    """Options written after the overrides land in REMAINDER; move them back onto ``args``."""
    overrides: list[str] = []
    if hasattr(args, "eval_override") and args.eval_override is None:
        args.eval_override = []  # not argparse's default=[]: append would mutate the shared default
    items = iter(rest)
    for item in items:
        if item == "--no-progress":
            args.no_progress = True
        elif item in ("--eval", "--no-eval") and hasattr(args, "evaluate"):
            args.evaluate = item == "--eval"
        elif item == "--eval-override" and hasattr(args, "eval_override"):
            args.eval_override.append(next(items, ""))
        elif item.startswith("--eval-override=") and hasattr(args, "eval_override"):
            args.eval_override.append(item.split("=", 1)[1])
        else:
            overrides.append(item)
    return overrides


def run(verb: str, args: argparse.Namespace) -> int:
    args.overrides = pull_flags(args, args.overrides)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        print(f"rlinf-ext {verb}: overrides must look like key=value, got {bad}", file=sys.stderr)
        return 2
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.runner.errors import LaunchError, RunInterrupted, RunPreempted
    from rlinf_ext.runner.launch import run_evaluation_only, run_training
    from rlinf_ext.runner.services import interrupt_received

    try:
        if verb == "train":
            run_training(
                args.config,
                args.overrides,
                show_progress=not args.no_progress,
                evaluate=args.evaluate,
                eval_overrides=args.eval_override,
            )
        elif verb == "eval":
            run_evaluation_only(args.config, args.overrides, show_progress=not args.no_progress)
        else:
            raise ValueError(f"rlinf_ext.runner.commands does not implement the verb '{verb}'")
    except LaunchError as exc:
        if name := interrupt_received():  # a worker call broken by the stop itself: the cause is the signal
            print(f"\nrlinf-ext {verb}: interrupted ({name}); while stopping: {exc}", file=sys.stderr)
            return EXIT_INTERRUPTED
        print(f"\nrlinf-ext {verb}: {exc}", file=sys.stderr)
        return 1
    except RunPreempted as exc:
        print(f"rlinf-ext {verb}: {exc}", file=sys.stderr)
        return EXIT_PREEMPTED
    except RunInterrupted as exc:
        print(f"rlinf-ext {verb}: interrupted ({exc}); everything this run started was stopped.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if name := interrupt_received():
            print(
                f"\nrlinf-ext {verb}: interrupted ({name}); while stopping: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        raise
    return 0
