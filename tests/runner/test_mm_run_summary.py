"""The run summary of an MMSearch-R1 run: accuracy and image-search ratio per FVQA category at every validation
pass, read back from metrics.jsonl (as the text agent's validation EM per pass)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from rlinf_ext.agent.mmsearch.summary import ValidationPoint, summary_lines
from rlinf_ext.agent.mmsearch.summary import validation_trend as mm_validation_trend
from rlinf_ext.runner.summary import RunSummary, fill_from_logs, run_rows, validation_trend


def _row(step: int, n: int, **values: float) -> dict:
    """values: <category>__<column> -> val/<category>/<column>."""
    row = {"step": step, "val/n": n}
    row.update({f"val/{k.replace('__', '/')}": v for k, v in values.items()})
    return row


def test_mm_validation_trend_per_category_at_each_pass(tmp_path):
    rows = [
        _row(
            0,
            4,
            search_required__accuracy=0.0,
            all__accuracy=0.25,
            search_free__accuracy=0.5,
            search_free__search_ratio_image=1.0,
            all__search_ratio_image=0.75,
            search_required__search_ratio_image=0.5,
        ),
        {"step": 1, "reward/mean": 0.1, "rollout/all/accuracy": 0.3},  # a training step: no validation
        _row(
            2,
            4,
            all__accuracy=0.5,
            search_free__accuracy=1.0,
            search_required__accuracy=0.0,
            all__search_ratio_image=0.25,
            search_free__search_ratio_image=0.0,
            search_required__search_ratio_image=0.5,
        ),
        {"step": 3, "val/nq/em": 0.3, "val/all/em": 0.3},
    ]  # Search-R1's keys are not MM passes
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trend = mm_validation_trend(run_rows(tmp_path))
    assert trend == [
        ValidationPoint(
            0,
            {"all": 0.25, "search_free": 0.5, "search_required": 0.0},
            {"all": 0.75, "search_free": 1.0, "search_required": 0.5},
            4,
        ),
        ValidationPoint(
            2,
            {"all": 0.5, "search_free": 1.0, "search_required": 0.0},
            {"all": 0.25, "search_free": 0.0, "search_required": 0.5},
            4,
        ),
    ]
    assert mm_validation_trend(run_rows(tmp_path, last_step=1)) == trend[:1]
    # the runner reads the lines from the agent's entry (AgentSpec.summary), not from the agent's package
    cfg = SimpleNamespace(
        agentloop=SimpleNamespace(agent="mmsearch"),
        runner=SimpleNamespace(logger=SimpleNamespace(log_path=str(tmp_path)), rollout_data_dir=None),
    )
    summary = RunSummary("tiny-mm")
    fill_from_logs(summary, cfg)
    assert summary.agent_lines == summary_lines(run_rows(tmp_path)) and len(summary.agent_lines) == 3
    text = summary.format()
    assert "  validation accuracy per category (greedy, 4 test questions):\n" in text
    assert (
        "    step 0: accuracy all 0.250, search_free 0.500, search_required 0.000; "
        "image-search ratio all 0.750, search_free 1.000, search_required 0.500\n"
    ) in text
    assert (
        "    step 2: accuracy all 0.500, search_free 1.000, search_required 0.000; "
        "image-search ratio all 0.250, search_free 0.000, search_required 0.500\n"
    ) in text


def test_a_text_run_has_no_mm_validation_lines(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/all/em": 0.25, "val/n": 8}) + "\n")
    assert summary_lines(run_rows(tmp_path)) == []
    cfg = SimpleNamespace(
        agentloop=SimpleNamespace(agent="searchr1"),
        runner=SimpleNamespace(logger=SimpleNamespace(log_path=str(tmp_path)), rollout_data_dir=None),
    )
    summary = RunSummary("tiny")
    fill_from_logs(summary, cfg)
    assert summary.agent_lines == [] and summary.validations == validation_trend(tmp_path)
    assert "per category" not in summary.format()
