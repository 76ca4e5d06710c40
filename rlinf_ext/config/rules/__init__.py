"""Cross-field rules of an experiment config, one module per theme, and ``run_rules``, which runs every rule
registered with ``config/rule_registry.py``. Each rule returns issues (key, reason, fix); none raises.

`skip` holds dotted keys whose value already failed the structural check: a rule reading one of them is not
run, so one mistake is reported once.
"""

from __future__ import annotations

import importlib

# imported for their @rule registrations
from rlinf_ext.config import memory_plan  # noqa: F401
from rlinf_ext.config.rule_registry import registered_rules
from rlinf_ext.config.rules import (  # noqa: F401
    actor,
    agents,
    async_rollout,
    batch,
    critic,
    data,
    dynamic_sampling,
    generation,
    hardware,
    placement,
    tools,
)
from rlinf_ext.config.rules.paths import path_issues
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue
from rlinf_ext.protocol.agents import agent_spec


def run_rules(cfg: ExperimentConfig, skip: set[str] = frozenset(), check_paths: bool = False) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    spec = None if "agentloop.agent" in skip else agent_spec(cfg)
    if spec is not None and spec.rules:
        importlib.import_module(spec.rules)  # registers the agent's own rules (rule(..., agent=spec.name))
    for reads, fn in registered_rules(spec.name if spec is not None else None):
        if any(k in skip for k in reads):
            continue
        issues.extend(fn(cfg))
    if check_paths:
        issues += path_issues(cfg)
    return issues
