"""CLI verbs `validate`, `show` and `plan` (see rlinf_ext/cli.py for the verb protocol)."""

from __future__ import annotations

import argparse
import sys

from rlinf_ext.config.loader import check_config, to_yaml
from rlinf_ext.config.memory_plan import format_in_flight, format_memory
from rlinf_ext.config.placement import COLLOCATED, BatchPlan, fmt_ranks, placement_mode, placements
from rlinf_ext.config.schema import ExperimentConfig


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", help="experiment YAML: a path, or a name under examples/searchr1/config/ or examples/mmsearch/config/"
    )
    parser.add_argument(
        "overrides", nargs="*", help="key=value overrides (OmegaConf dotlist), e.g. data.rollout_batch_size=16"
    )
    if verb == "validate":
        parser.add_argument("--check-paths", action="store_true", help="also check that every input path exists")


def run(verb: str, args: argparse.Namespace) -> int:
    checked = check_config(args.config, args.overrides, check_paths=getattr(args, "check_paths", False))
    for warning in checked.warnings:
        print(f"# warning: {warning}", file=sys.stderr)
    if verb == "validate":
        if checked.ok:
            print(f"{args.config}: valid")
            return 0
        print(f"{args.config}: {len(checked.issues)} problem(s)", file=sys.stderr)
        for issue in checked.issues:
            print(f"  - {issue}", file=sys.stderr)
        return 1
    if checked.cfg is None:  # could not even compose
        for issue in checked.issues:
            print(f"  - {issue}", file=sys.stderr)
        return 1
    if checked.issues:  # show/plan still print, but say what is wrong
        print(f"# warning: {len(checked.issues)} problem(s); run `rlinf-ext validate` for details:", file=sys.stderr)
        for issue in checked.issues:
            print(f"#   {issue.key}: {issue.reason}", file=sys.stderr)
    if verb == "show":
        print(to_yaml(checked.cfg), end="")
        return 0
    print(format_plan(checked.cfg))
    return 0


def batch_plan(cfg: ExperimentConfig) -> BatchPlan | None:
    plans, _ = placements(cfg)
    actor = plans.get("actor")
    dp = actor.dp if actor is not None and actor.dp >= 1 else 1
    if cfg.runner.task_type != "reasoning":
        dp = 1
    return BatchPlan(
        prompts_per_step=cfg.data.rollout_batch_size,
        group_size=cfg.algorithm.group_size,
        n_minibatches=cfg.algorithm.n_minibatches,
        data_parallel_size=dp,
        micro_batch_size=cfg.algorithm.training_batch_size_per_gpu,
    )


def format_plan(cfg: ExperimentConfig) -> str:
    c = cfg.cluster
    gpu = c.num_gpus_per_node > 0
    hw = (
        f"{c.num_nodes} node(s) x {c.num_gpus_per_node} GPU(s)"
        if gpu
        else f"{c.num_nodes} node(s), CPU only (ranks = processes on node 0)"
    )
    lines = [
        f"experiment: {cfg.runner.experiment_name}  (task: {cfg.runner.task_type})",
        f"cluster: {hw}",
        "",
        "placement:",
    ]
    plans, issues = placements(cfg)
    header = (
        f"  {'component':<10} {'node':<5} {'GPUs' if gpu else 'procs':<8} {'world':>5} {'TP':>3} {'PP':>3} {'DP':>3}"
    )
    lines.append(header)
    for name, plan in plans.items():
        for node, local in plan.nodes().items():
            lines.append(
                f"  {name:<10} {node:<5} {fmt_ranks(local):<8} {plan.world_size:>5} {plan.tp:>3} {plan.pp:>3} {plan.dp:>3}"
            )
    if gpu and "actor" in plans and "rollout" in plans and not issues:
        mode = placement_mode(cfg)
        lines.append(
            f"  actor and rollout: {mode}" + (" (they take turns on the same GPUs)" if mode == COLLOCATED else "")
        )
    for issue in issues:
        lines.append(f"  ! {issue.key}: {issue.reason}")
    b = batch_plan(cfg)
    rollout = plans.get("rollout")
    rows: list[tuple[str, str]] = [
        ("prompts/step", str(b.prompts_per_step)),
        ("group size", str(b.group_size)),
        ("trajectories/step", f"{b.prompts_per_step} x {b.group_size} = {b.trajectories_per_step}"),
    ]
    if rollout is not None and rollout.dp >= 1:
        engines = rollout.dp
        rows.append(("rollout engines (DP)", str(engines)))
        rows.append(("prompts/engine", f"{b.prompts_per_step} / {engines} = {b.prompts_per_step / engines:g}"))
    if cfg.runner.task_type == "reasoning":
        rows += [
            ("minibatches", str(b.n_minibatches)),
            (
                "trajectories/minibatch",
                f"{b.trajectories_per_step} / {b.n_minibatches} = {b.trajectories_per_minibatch}",
            ),
            ("actor data-parallel size", str(b.data_parallel_size)),
            ("trajectories/DP rank/minibatch", str(b.trajectories_per_rank_per_minibatch)),
            ("micro-batch size", str(b.micro_batch_size)),
            ("micro-batches/DP rank/minibatch", str(b.micro_batches_per_rank_per_minibatch)),
            ("optimizer steps/rollout step", str(b.optimizer_steps_per_rollout_step)),
        ]
    else:
        rows.append(("optimizer steps/rollout step", "0 (evaluation)"))
    width = max(len(label) for label, _ in rows)
    lines += ["", "batch arithmetic (per rollout step):"]
    lines += [f"  {label.ljust(width)}  {value}" for label, value in rows]
    lines += format_in_flight(cfg)
    lines += format_memory(cfg)
    return "\n".join(lines)
