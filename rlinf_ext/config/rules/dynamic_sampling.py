"""Rules of dynamic sampling (``algorithm.adv_type: grpo_dynamic`` with ``algorithm.max_num_gen_batches``,
``runner/dynamic_sampling.py``): a positive batch count, refills only where all-equal groups are dropped, no
refill with batches dispatched ahead, and no group admission (``runner.admission: group``)."""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue

KEY = "algorithm.max_num_gen_batches"
ADV = "algorithm.adv_type"


@rule(KEY)
def gen_batches_are_positive(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    n = cfg.algorithm.max_num_gen_batches
    if n < 1:
        yield ConfigIssue(
            KEY,
            f"{KEY}={n}: a step generates at least its own batch.",
            f"set {KEY}=1 (no refill) or more (with {ADV}=grpo_dynamic).",
        )


@rule(KEY, ADV)
def refills_need_dynamic_sampling(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Plain GRPO keeps every group, so the first batch always fills the step: a refill would never run."""
    n = cfg.algorithm.max_num_gen_batches
    if n > 1 and cfg.algorithm.adv_type != "grpo_dynamic":
        yield ConfigIssue(
            KEY,
            f"{KEY}={n} refills a step whose all-equal groups were dropped, but "
            f"{ADV}={cfg.algorithm.adv_type} drops none: the refill would never run.",
            f"set {ADV}=grpo_dynamic to drop them, or {KEY}=1.",
        )


@rule(KEY, ADV, "runner.max_staleness", "runner.task_type")
def refills_need_the_synchronous_order(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """With batches dispatched ahead, step b + 1's batch is read before step b knows how many refills it needs:
    the refills would take later batches of the order than the ones in flight, and the checkpoint's one-number
    data position (the batches read after the last trained one) would no longer say which prompts were trained."""
    n, k = cfg.algorithm.max_num_gen_batches, cfg.runner.max_staleness
    if n > 1 and k > 0 and is_training(cfg):
        yield ConfigIssue(
            KEY,
            f"{KEY}={n} refills a step from the run's data order, but runner.max_staleness={k} "
            "has already dispatched the next batches from it: a refill cannot tell which prompts "
            "come next, and a resume could not either.",
            f"set runner.max_staleness=0 with refills, or {KEY}=1 (drop without refill works at any k).",
        )


@rule(ADV, "runner.admission", "runner.task_type")
def group_admission_keeps_every_group(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Group admission trains every dispatched prompt exactly once, and its checkpoint names the prompts in flight
    by batch and slot; dynamic sampling drops groups and reads refills from the order by score: the two do not
    compose yet (no test shows which prompts a resume would owe)."""
    if cfg.runner.admission == "group" and cfg.algorithm.adv_type == "grpo_dynamic" and is_training(cfg):
        yield ConfigIssue(
            "runner.admission",
            "runner.admission=group admits groups as they complete, but "
            f"{ADV}=grpo_dynamic selects them by score from whole batches and refills: the two "
            "selections do not compose.",
            f"set runner.admission=batch with {ADV}=grpo_dynamic, or {ADV}=grpo with group admission.",
        )
