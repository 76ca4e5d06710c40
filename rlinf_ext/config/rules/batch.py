"""Batch-arithmetic rules: positive counts, a GRPO group that can compare responses, and a step's trajectories
splitting into minibatches over the actor's data-parallel ranks."""

from __future__ import annotations

import math
from collections.abc import Iterator

from rlinf_ext.config.placement import placements
from rlinf_ext.config.rule_registry import is_grpo, is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue


@rule("algorithm.n_minibatches", "algorithm.training_batch_size_per_gpu", "data.rollout_batch_size")
def positive_counts(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    for key, value in (
        ("algorithm.n_minibatches", cfg.algorithm.n_minibatches),
        ("algorithm.training_batch_size_per_gpu", cfg.algorithm.training_batch_size_per_gpu),
        ("data.rollout_batch_size", cfg.data.rollout_batch_size),
    ):
        if value < 1:
            yield ConfigIssue(key, f"must be >= 1, got {value}.", f"set {key} to 1 or more.")


@rule("algorithm.adv_type", "algorithm.group_size", "runner.task_type")
def group_size_fits_task(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    gs = cfg.algorithm.group_size
    if gs < 1:
        yield ConfigIssue("algorithm.group_size", f"must be >= 1, got {gs}.", "set algorithm.group_size to 1 or more.")
    elif is_training(cfg) and is_grpo(cfg) and gs <= 1:
        yield ConfigIssue(
            "algorithm.group_size",
            f"GRPO ({cfg.algorithm.adv_type}) compares responses within a group; group_size={gs} gives zero advantages.",
            "set algorithm.group_size to 2 or more (the reference uses 4).",
        )
    elif cfg.runner.task_type == "reasoning_eval" and gs != 1:
        yield ConfigIssue(
            "algorithm.group_size",
            f"evaluation (runner.task_type=reasoning_eval) scores one response per question, got group_size={gs}.",
            "set algorithm.group_size=1.",
        )


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
