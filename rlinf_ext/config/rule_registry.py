"""The registry of cross-field config rules: ``@rule(keys...)`` registers a check that yields ``ConfigIssue``s
(key, reason, fix) and never raises; ``registered_rules()`` lists them in registration order.

The rules themselves, one module per theme under ``config/rules/``: ``generation`` (stops, engine log-probs, the
sequence budget), ``batch`` (counts, GRPO groups, minibatch splits), ``data``, ``tools`` (search, retrieval),
``placement`` (placement, model dimensions), ``actor`` (backend, offload, Megatron knobs), ``hardware`` (rollout
backend vs. cluster, the SGLang profile), ``agents`` (the agents' own rules) and ``paths`` (``--check-paths``);
besides them ``config/memory_plan.py`` (GPU memory) and ``config/rules_support.py`` (keys accepted for RLinf's sake
that rlinf_ext does not implement). ``config/rules/__init__.py`` imports them all; its ``run_rules`` runs them.
"""

from __future__ import annotations

from typing import Callable, Iterable

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue

Rule = Callable[[ExperimentConfig], Iterable[ConfigIssue]]
_RULES: list[tuple[tuple[str, ...], Rule]] = []


def rule(*reads: str) -> Callable[[Rule], Rule]:
    """Register a rule with the keys it reads (a rule is skipped when one of them is invalid)."""

    def deco(fn: Rule) -> Rule:
        _RULES.append((reads, fn))
        return fn

    return deco


def registered_rules() -> list[tuple[tuple[str, ...], Rule]]:
    return list(_RULES)


def is_grpo(cfg: ExperimentConfig) -> bool:
    return cfg.algorithm.adv_type in ("grpo", "grpo_dynamic")


def is_training(cfg: ExperimentConfig) -> bool:
    return cfg.runner.task_type == "reasoning"
