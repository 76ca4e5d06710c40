"""The registry of cross-field config rules: ``@rule(keys...)`` registers a check that yields ``ConfigIssue``s
(key, reason, fix) and never raises; ``registered_rules()`` lists them in registration order.

The rules themselves: ``config/rules.py`` (generation, data, tools, retrieval, paths), ``config/rules_placement.py``
(placement, batch arithmetic, model dimensions) and ``config/rules_support.py`` (values supported only in some
settings). ``config/rules.py:run_rules`` runs them all.

A rule that reads a key of RLinf's compatibility table (``config/compat.py``) is not registered: such a key is not
in the typed config, and the structural check already refuses every value but the accepted one.
"""

from __future__ import annotations

from typing import Callable, Iterable

from rlinf_ext.config.compat import BY_KEY as COMPAT_KEYS
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue

Rule = Callable[[ExperimentConfig], Iterable[ConfigIssue]]
_RULES: list[tuple[tuple[str, ...], Rule]] = []


def rule(*reads: str) -> Callable[[Rule], Rule]:
    """Register a rule with the keys it reads (a rule is skipped when one of them is invalid)."""

    def deco(fn: Rule) -> Rule:
        if not any(key in COMPAT_KEYS for key in reads):
            _RULES.append((reads, fn))
        return fn

    return deco


def registered_rules() -> list[tuple[tuple[str, ...], Rule]]:
    return list(_RULES)


def is_grpo(cfg: ExperimentConfig) -> bool:
    return cfg.algorithm.adv_type in ("grpo", "grpo_dynamic")


def is_training(cfg: ExperimentConfig) -> bool:
    return cfg.runner.task_type == "reasoning"
