"""`run_evaluation(cfg, ...)` for any agent: the evaluation the agent registry names for `agentloop.agent` (the
Search-R1 runner, or the MMSearch-R1 one with images, two tools and a per-category table)."""

from __future__ import annotations

from typing import Any

from rlinf_ext.agent.registry import agent_spec
from rlinf_ext.eval.runner import EvalSummary


def run_evaluation(cfg: Any, generator=None, **kwargs: Any) -> EvalSummary:
    """Evaluate as `cfg.agentloop.agent` says; keyword arguments as `eval.runner.run_evaluation`'s."""
    return agent_spec(cfg).load("evaluation")(cfg, generator, **kwargs)
