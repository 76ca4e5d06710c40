"""`run_evaluation(cfg, ...)` for any agent: the Search-R1 runner, or the MMSearch-R1 one for agent mmsearch
(images, two tools, a per-category table). The launcher calls this; both runners stay importable on their own."""

from __future__ import annotations

from typing import Any

from rlinf_ext.eval.mm_runner import run_mm_evaluation
from rlinf_ext.eval.runner import EvalSummary
from rlinf_ext.eval.runner import run_evaluation as run_text_evaluation


def run_evaluation(cfg: Any, generator=None, **kwargs: Any) -> EvalSummary:
    """Evaluate as `cfg.agentloop.agent` says; keyword arguments as `eval.runner.run_evaluation`'s."""
    if cfg.agentloop.agent == "mmsearch":
        return run_mm_evaluation(cfg, generator, **kwargs)
    return run_text_evaluation(cfg, generator, **kwargs)
