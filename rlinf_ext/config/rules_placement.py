"""Placement, batch-arithmetic and model-dimension rules of an experiment config, and ``placements``: the plan
``validate`` and ``rlinf-ext plan`` both read (component -> ranks, TP x PP, data-parallel size)."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterator
from pathlib import Path

from rlinf_ext.config.placement import COMPONENTS, ComponentPlan, placement_entries, split_components
from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue

_PARALLEL_KEYS = {
    "actor": ("actor.model.tensor_model_parallel_size", "actor.model.pipeline_model_parallel_size"),
    "rollout": ("rollout.tensor_parallel_size", "rollout.pipeline_parallel_size"),
}


def placements(cfg: ExperimentConfig) -> tuple[dict[str, ComponentPlan], list[ConfigIssue]]:
    """component -> plan, with issues for bad ranks, unknown components and TP x PP mismatches."""
    cluster = cfg.cluster
    gpn = cluster.num_gpus_per_node
    total = cluster.num_nodes * gpn if gpn > 0 else None
    parallel = {
        "actor": (cfg.actor.model.tensor_model_parallel_size, cfg.actor.model.pipeline_model_parallel_size),
        "rollout": (cfg.rollout.tensor_parallel_size, cfg.rollout.pipeline_parallel_size),
    }
    plans: dict[str, ComponentPlan] = {}
    issues: list[ConfigIssue] = []
    for entry in placement_entries(cluster.component_placement, total, max(cluster.num_nodes, 1)):
        dotted = f"cluster.component_placement.{entry.key}"
        if entry.error is not None:
            issues.append(ConfigIssue(dotted, entry.error.reason, entry.error.fix))
            continue
        ranks = entry.ranks
        for name in entry.components:
            if name not in COMPONENTS:
                close = difflib.get_close_matches(name, COMPONENTS, n=2)
                fix = (
                    f"did you mean {' or '.join(close)}?" if close else f"use component names {', '.join(COMPONENTS)}."
                )
                issues.append(ConfigIssue(dotted, f"unknown component '{name}'.", fix))
                continue
            if name in plans:
                issues.append(ConfigIssue(dotted, f"component '{name}' is placed twice.", "place each component once."))
                continue
            tp, pp = parallel.get(name, (1, 1))
            plans[name] = ComponentPlan(name, tuple(ranks), gpn, tp, pp, process_nodes=entry.nodes)
    for name, (tp, pp) in parallel.items():
        plan = plans.get(name)
        if plan is None:
            continue
        tp_key, pp_key = _PARALLEL_KEYS[name]
        if tp < 1 or pp < 1:
            key = tp_key if tp < 1 else pp_key
            issues.append(ConfigIssue(key, f"TP={tp}, PP={pp}: both must be >= 1.", f"set {key}=1 or more."))
        elif plan.world_size % (tp * pp):
            issues.append(
                ConfigIssue(
                    tp_key,
                    f"TP x PP = {tp} x {pp} = {tp * pp} does not divide the {plan.world_size} ranks of {name} "
                    f"({spec_of(cfg, name)}).",
                    f"choose TP x PP dividing {plan.world_size}, or place {name} on a multiple of {tp * pp} GPUs.",
                )
            )
    required = ("actor", "rollout", "reward") if is_training(cfg) else ("rollout", "reward")
    for name in required:
        if name not in plans and not any(name in split_components(k) for k in cluster.component_placement):
            issues.append(
                ConfigIssue(
                    "cluster.component_placement",
                    f"component '{name}' has no placement.",
                    "add it, e.g. cluster.component_placement={'actor,rollout,reward': all}.",
                )
            )
    return plans, issues


def spec_of(cfg: ExperimentConfig, name: str) -> str:
    for key, spec in cfg.cluster.component_placement.items():
        if name in split_components(key):
            return f"{key}: {spec}"
    return "unplaced"


@rule(
    "cluster.num_nodes",
    "cluster.num_gpus_per_node",
    "cluster.component_placement",
    "runner.task_type",
    "actor.model.tensor_model_parallel_size",
    "actor.model.pipeline_model_parallel_size",
    "rollout.tensor_parallel_size",
    "rollout.pipeline_parallel_size",
)
def placement_fits_cluster(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.cluster.num_nodes < 1 or cfg.cluster.num_gpus_per_node < 0:
        yield ConfigIssue("cluster.num_nodes", "needs >= 1 node and >= 0 GPUs per node.", "fix the cluster profile.")
        return
    yield from placements(cfg)[1]


@rule(
    "data.rollout_batch_size",
    "algorithm.group_size",
    "algorithm.n_minibatches",
    "algorithm.training_batch_size_per_gpu",
    "cluster.component_placement",
    "cluster.num_gpus_per_node",
    "cluster.num_nodes",
    "actor.model.tensor_model_parallel_size",
    "actor.model.pipeline_model_parallel_size",
    "runner.task_type",
)
def batch_divides(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if not is_training(cfg):
        return
    rbs, gs, nmb = cfg.data.rollout_batch_size, cfg.algorithm.group_size, cfg.algorithm.n_minibatches
    mbs = cfg.algorithm.training_batch_size_per_gpu
    if min(rbs, gs, nmb, mbs) < 1:
        return  # reported by other rules
    total = rbs * gs
    if total % nmb:
        yield ConfigIssue(
            "algorithm.n_minibatches",
            f"data.rollout_batch_size x algorithm.group_size = {rbs} x {gs} = {total} trajectories do not split "
            f"into {nmb} equal minibatches.",
            f"choose n_minibatches dividing {total}, or change data.rollout_batch_size.",
        )
        return
    if cfg.cluster.num_gpus_per_node < 0 or cfg.cluster.num_nodes < 1:
        return
    plans, placement_issues = placements(cfg)
    actor = plans.get("actor")
    if actor is None or placement_issues or actor.dp < 1:
        return
    if rbs % actor.dp:
        # each data-parallel actor rank trains on whole GRPO groups (training/data_parallel.share_of)
        yield ConfigIssue(
            "data.rollout_batch_size",
            f"{rbs} prompts (GRPO groups) per step do not split over the actor's data-parallel size {actor.dp}.",
            f"make data.rollout_batch_size a multiple of {actor.dp} (e.g. data.rollout_batch_size={-(-rbs // actor.dp) * actor.dp}).",
        )
        return
    per_minibatch = total // nmb
    if total % actor.dp or per_minibatch % (actor.dp * mbs):
        yield ConfigIssue(
            "data.rollout_batch_size",
            f"{rbs} prompts x group {gs} = {total} trajectories -> {nmb} minibatches of {per_minibatch}, which "
            f"do not split over data-parallel size {actor.dp} x micro-batch {mbs}.",
            f"make rollout_batch_size x group_size / n_minibatches a multiple of {actor.dp * mbs} "
            f"(e.g. data.rollout_batch_size={_next_batch(rbs, gs, nmb * actor.dp * mbs)}).",
        )


def _next_batch(rbs: int, gs: int, unit: int) -> int:
    """Smallest rollout_batch_size >= rbs with rbs * gs a multiple of unit."""
    step = unit // math.gcd(gs, unit)
    return -(-rbs // step) * step


# ------------------------------------------------------------------------------------------ model dims
def model_dims(cfg: ExperimentConfig) -> tuple[int | None, int | None, str]:
    """(attention heads, KV groups, source): from the preset, else from config.json when the model exists."""
    m = cfg.actor.model
    if m.num_attention_heads is not None:
        return m.num_attention_heads, m.num_query_groups or m.num_attention_heads, "actor.model (preset)"
    path = Path(str(cfg.rollout.model.model_path)) / "config.json"
    if path.is_file():
        hf = json.loads(path.read_text())
        heads = hf.get("num_attention_heads")
        return heads, hf.get("num_key_value_heads", heads), str(path)
    return None, None, "unknown"


@rule(
    "actor.model.tensor_model_parallel_size",
    "rollout.tensor_parallel_size",
    "actor.model.num_attention_heads",
    "actor.model.num_query_groups",
)
def tp_divides_heads(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    heads, groups, source = model_dims(cfg)
    if heads is None:
        return
    for key, tp in (
        ("actor.model.tensor_model_parallel_size", cfg.actor.model.tensor_model_parallel_size),
        ("rollout.tensor_parallel_size", cfg.rollout.tensor_parallel_size),
    ):
        if tp < 1:
            continue
        for what, n in (("attention heads", heads), ("KV groups", groups)):
            if n % tp:
                ok = [d for d in range(1, n + 1) if n % d == 0 and heads % d == 0 and groups % d == 0]
                yield ConfigIssue(
                    key,
                    f"TP={tp} does not divide the model's {n} {what} (from {source}).",
                    f"use a TP in {ok}.",
                )
                break
