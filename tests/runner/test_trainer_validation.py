"""Validation during training, wired into the RLinf-scheduler runner (CPU): before the first step and after
every step, greedy, through the rollout group from the driver, with the weights of the step just trained."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from trainer_helpers import kill_groups, make_cfg, make_trainer

pytestmark = pytest.mark.timeout(600)

VAL_BENCHES = ("nq", "bamboogle")
PER_BENCH = 2


# ---------------------------------------------------------------- pure: when a ValidationPass is built


def _cfg(interval: int, before: bool, paths=("nq.jsonl",)):
    return SimpleNamespace(
        runner=SimpleNamespace(val_check_interval=interval, val_before_train=before, val_samples_per_benchmark=3),
        data=SimpleNamespace(val_data_paths=list(paths)),
    )


class _FakePass:
    built: list["_FakePass"] = []

    def __init__(self, cfg, generator, **kwargs):
        self.generator, self.kwargs = generator, kwargs
        _FakePass.built.append(self)


def _bare_trainer(cfg, tmp_path):
    """A trainer object without Ray: only what validation_pass/validate read."""
    from rlinf_ext.runner.trainer import GRPOTrainer

    trainer = GRPOTrainer.__new__(GRPOTrainer)
    trainer.cfg, trainer.groups, trainer.run_dir = cfg, None, tmp_path / "run"
    trainer.channels = {"GenerateInput": object(), "GenerateOutput": object()}
    trainer._serving, trainer._validation, trainer.val_history = object(), None, {}
    return trainer


def test_validation_enabled_matches_should_validate():
    from rlinf_ext.eval.core.validation import should_validate, validation_enabled

    for interval in (-1, 0, 1, 3):
        for before in (False, True):
            for paths in ((), ("x.jsonl",)):
                cfg = _cfg(interval, before, paths)
                expected = any(should_validate(cfg, s) for s in range(7))
                assert validation_enabled(cfg) == expected, (interval, before, paths)


def test_no_validation_pass_without_validation(monkeypatch, tmp_path):
    from rlinf_ext.eval.core import validation
    from rlinf_ext.workers.agent_loop import ChannelGenerator

    monkeypatch.setattr(validation, "validation_pass_class", lambda cfg: _FakePass)
    _FakePass.built.clear()
    off = _bare_trainer(_cfg(-1, False), tmp_path)
    assert off.validation_pass() is None
    assert all(off.validate(step) == {} for step in range(5))  # no sync, no pass: groups is None here
    assert _FakePass.built == [] and off.val_history == {}

    on = _bare_trainer(_cfg(2, False), tmp_path)  # control: the same code path builds exactly one pass
    first = on.validation_pass()
    assert first is on.validation_pass() and _FakePass.built == [first]
    assert isinstance(first.generator, ChannelGenerator)
    assert first.generator.input_channel is on.channels["GenerateInput"]
    assert first.kwargs["samples_per_benchmark"] == 3 and first.kwargs["do_sample"] is False
    assert Path(first.kwargs["out_dir"]) == tmp_path / "run" / "validation"


# ---------------------------------------------------------------- CPU cluster: validation at steps 0, 1, 2


@pytest.mark.slow
def test_validation_before_and_after_every_step(tiny_assets, tmp_path, cluster, retrieval_url):
    from rlinf_ext.runner.metrics import MetricsSink, read_metrics

    cfg = make_cfg(
        tiny_assets,
        tmp_path,
        retrieval_url,
        **{
            "runner.max_steps": 2,
            "algorithm.n_minibatches": 1,
            "algorithm.training_batch_size_per_gpu": 2,
            "algorithm.sampling_params.max_new_tokens": 16,
            "runner.val_check_interval": 1,
            "runner.val_before_train": True,
            "runner.val_samples_per_benchmark": PER_BENCH,
            "data.val_data_paths": [str(tiny_assets.rlinf_test[b]) for b in VAL_BENCHES],
            "data.val_rollout_batch_size": PER_BENCH * len(VAL_BENCHES),
        },
    )
    sink = MetricsSink(log_dir=tmp_path / "logs", show_progress=False)
    seen: dict[int, tuple[dict, list]] = {}

    def on_step(step, metrics, trajectories):
        seen[step] = (dict(metrics), trajectories)
        sink(step, metrics, trajectories)

    trainer = make_trainer(cfg, cluster, retrieval_url, on_step=on_step, data_size=8)
    groups = trainer.groups
    n_val = PER_BENCH * len(VAL_BENCHES)
    try:
        trainer.init_workers()
        summary = trainer.run()
        assert summary["steps"] == 2 and summary["steps_this_run"] == 2
        assert sorted(seen) == [0, 1, 2]
        assert seen[0][1] == [] and "reward/mean" not in seen[0][0]  # before training: validation only
        for step in (1, 2):
            assert "reward/mean" in seen[step][0] and len(seen[step][1]) == 2 * 2
        for step, (metrics, _) in seen.items():
            for key in (
                "val/all/em",
                "val/all/f1",
                "val/avg/em",
                "val/nq/em",
                "val/bamboogle/subem",
                "val/all/turns",
                "time/validation",
            ):
                assert key in metrics and math.isfinite(metrics[key]), (step, key)
            assert metrics["val/n"] == n_val and metrics["val/errors"] == 0.0, step
            assert metrics["time/validation"] > 0
            assert trainer.val_history[step]["val/all/em"] == metrics["val/all/em"]
        # one generations file per pass, the same fixed questions each time
        question_sets = []
        for step in (0, 1, 2):
            path = tmp_path / "t" / "validation" / f"global_step_{step}" / "generations.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            assert len(rows) == n_val, (step, len(rows))
            question_sets.append({(r["benchmark"], r["item_id"]) for r in rows})
        assert question_sets[0] == question_sets[1] == question_sets[2]
        assert {b for b, _ in question_sets[0]} == set(VAL_BENCHES)
        # the pass after step 2 ran on the weights after step 2 (one optimizer step per rollout step):
        # without the extra sync the engine would still hold the weights synced before step 2 (version 1)
        state = groups.rollout.get_state().wait()[0]
        assert state["weight_version"] == 2
        assert state["last_sync_logit_diff"] is not None and state["last_sync_logit_diff"] < 1e-3
        assert summary["last_validation"]["val/n"] == n_val
    finally:
        trainer.shutdown()
        kill_groups(groups)
        sink.close()
    # the logging sink takes the step-0 row: jsonl rows 0, 1, 2 with val/... and a reward curve from steps 1-2
    rows = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("val/all/em" in r for r in rows) and "reward/mean" not in rows[0]
    assert sink.rewards() == [seen[1][0]["reward/mean"], seen[2][0]["reward/mean"]]
    assert sink.plot_path is not None and sink.plot_path.exists()
