"""`evaluate_agent(cfg, ...)` for any agent: the evaluation the agent registry names for `agentloop.agent` (the
Search-R1 runner, or the MMSearch-R1 one with images, two tools and a per-category table)."""

from __future__ import annotations

from typing import Any

from rlinf_ext.eval.core.runner import EvalSummary
from rlinf_ext.protocol.agents import agent_spec


def evaluate_agent(cfg: Any, generator=None, **kwargs: Any) -> EvalSummary:
    """Evaluate as `cfg.agentloop.agent` says; keyword arguments as the agent's runner takes them
    (`eval.searchr1.runner.run_evaluation`, `eval.mmsearch.runner.run_evaluation`)."""
    return agent_spec(cfg).load("evaluation")(cfg, generator, **kwargs)
