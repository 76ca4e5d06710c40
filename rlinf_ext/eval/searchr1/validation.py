"""Validation during training: the evaluation on a fixed random subset, returned as flat metrics.

The trainer calls `ValidationPass.run(step)` when `eval.core.validation.should_validate(cfg, step)` says so (every
`runner.val_check_interval` steps, and at step 0 when `runner.val_before_train`). The subset is drawn once
(seeded), so every validation point scores the same questions and the curve is comparable across steps.
Decoding is greedy unless `do_sample=True` (Search-R1 validates greedily), whatever the training sampling is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlinf_ext.eval.core.runner import eval_concurrency, run_with_http_session, sampling_params_from_config
from rlinf_ext.eval.core.validation import sample_items, validation_records
from rlinf_ext.eval.searchr1.runner import evaluator, items_from_config, load_tokenizer, make_rollout_fn
from rlinf_ext.eval.searchr1.scoring import AVERAGED_FIELDS, Aggregate, aggregate
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.tools.base import Tool
from rlinf_ext.tools.registry import build_agent_tools

DEFAULT_SAMPLES_PER_BENCHMARK = 64
# metric name in the logs -> BenchmarkResult field
_LOGGED = {
    "em": "em",
    "subem": "subem",
    "f1": "f1",
    "searches": "mean_searches",
    "turns": "mean_turns",
    "response_length": "mean_response_length",
}


def validation_metrics(agg: Aggregate, prefix: str = mk.VAL_PREFIX) -> dict[str, float]:
    """`val/<bench>/em`, ..., `val/avg/<metric>` (mean over benchmarks), `val/all/<metric>` (pooled), `val/n`."""
    metrics: dict[str, float] = {}
    for bench, res in agg.benchmarks.items():
        for name, attr in _LOGGED.items():
            metrics[mk.validation_metric(bench, name, prefix)] = float(getattr(res, attr))
    for name, attr in _LOGGED.items():
        if attr in AVERAGED_FIELDS:
            metrics[mk.validation_metric("avg", name, prefix)] = float(agg.average[attr])
        metrics[mk.validation_metric("all", name, prefix)] = float(getattr(agg.overall, attr))
    metrics[f"{prefix}/n"] = float(agg.overall.n)
    metrics[f"{prefix}/errors"] = float(agg.overall.errors)
    return metrics


class ValidationPass:
    """Built once by the trainer; `run(step)` / `await arun(step)` evaluate the subset and return metrics.

    Generations of each pass go to `out_dir/global_step_<step>/generations.jsonl` when `out_dir` is set.
    """

    def __init__(
        self,
        cfg: Any,
        generator,
        tokenizer=None,
        tools: list[Tool] | None = None,
        samples_per_benchmark: int | None = DEFAULT_SAMPLES_PER_BENCHMARK,
        do_sample: bool = False,
        out_dir: str | Path | None = None,
        show_progress: bool = False,
    ):
        self.cfg = cfg
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(str(cfg.rollout.model.model_path))
        all_items = items_from_config(cfg, self.tokenizer)
        self.items = sample_items(all_items, samples_per_benchmark, seed=int(cfg.data.seed))
        self.tools = tools if tools is not None else build_agent_tools(cfg)
        self.tool_tags = [tool.tag_name() for tool in self.tools]
        params = sampling_params_from_config(cfg, do_sample=do_sample)
        self.rollout = make_rollout_fn(cfg, generator, self.tokenizer, self.tools, params)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.show_progress = show_progress

    async def arun(self, step: int) -> dict[str, float]:
        records = await validation_records(
            self.items,
            evaluator(self.rollout, self.tokenizer.decode, self.cfg.reward, self.tool_tags),
            self.out_dir,
            step,
            concurrency=eval_concurrency(self.cfg),
            show_progress=self.show_progress,
        )
        return validation_metrics(aggregate(records))

    def run(self, step: int) -> dict[str, float]:
        """Synchronous form for callers without a running event loop (closes its HTTP session at the end)."""
        return run_with_http_session(lambda: self.arun(step))

    @staticmethod
    def summary(metrics: dict[str, float]) -> str:
        """The trainer's one-line report of a pass."""
        return (
            f"EM avg {metrics.get(mk.VAL_AVG_EM, float('nan')):.3f}, pooled {metrics.get(mk.VAL_ALL_EM, float('nan')):.3f} "
            f"over {int(metrics.get(mk.VAL_N, 0))} questions ({int(metrics.get(mk.VAL_ERRORS, 0))} errors)"
        )
