"""The registry of cross-field config rules: ``@rule(keys...)`` registers a check that yields ``ConfigIssue``s
(key, reason, fix) and never raises; ``registered_rules()`` lists them in registration order. An issue made with
``warning=True`` is a choice that runs but is likely a mistake: validate prints it and still accepts the config.

The rules themselves, one module per theme under ``config/rules/``: ``generation`` (stops, engine log-probs, the
sequence budget), ``batch`` (counts, GRPO groups, minibatch splits), ``data``, ``tools`` (search, retrieval),
``placement`` (placement, model dimensions), ``actor`` (backend, offload, Megatron knobs), ``async_rollout``
(batches dispatched ahead, ``runner.max_staleness``), ``hardware`` (rollout backend vs. cluster, the SGLang
profile), ``agents`` (what every agent's registry entry implies) and ``paths`` (``--check-paths``); an agent's own
rules live in its ``AgentSpec.rules`` module, registered with ``agent=``; besides them ``config/memory_plan.py``
(GPU memory). RLinf's keys that rlinf_ext does not implement are not rules: the structural check refuses them by
the compatibility table (``config/compat.py``). ``config/rules/__init__.py`` imports them all; its ``run_rules`` runs them.
"""

from __future__ import annotations

from typing import Callable, Iterable

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue

Rule = Callable[[ExperimentConfig], Iterable[ConfigIssue]]
_RULES: list[tuple[tuple[str, ...], Rule]] = []


_AGENT_RULES: dict[str, list[tuple[tuple[str, ...], Rule]]] = {}


def rule(*reads: str, agent: str | None = None) -> Callable[[Rule], Rule]:
    """Register a rule with the keys it reads (a rule is skipped when one of them is invalid). With ``agent``, the
    rule belongs to that agent (its ``AgentSpec.rules`` module) and runs only on configs that choose it."""

    def deco(fn: Rule) -> Rule:
        (_AGENT_RULES.setdefault(agent, []) if agent else _RULES).append((reads, fn))
        return fn

    return deco


def registered_rules(agent: str | None = None) -> list[tuple[tuple[str, ...], Rule]]:
    """The shared rules, then ``agent``'s own (registered when its rules module was imported)."""
    return list(_RULES) + list(_AGENT_RULES.get(agent, []) if agent else [])


def is_grpo(cfg: ExperimentConfig) -> bool:
    return cfg.algorithm.adv_type in ("grpo", "grpo_dynamic")


def is_training(cfg: ExperimentConfig) -> bool:
    return cfg.runner.task_type == "reasoning"
