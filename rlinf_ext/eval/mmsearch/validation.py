"""MMSearch-R1 validation during training: the MM evaluation on a fixed subset of `data.val_data_paths`, with the
weights of the step, returned as flat metrics by FVQA category.

The loop, tools, reward and records are the evaluation's (`eval/mmsearch/runner.py`); the subset and the pass are
`eval/core/validation.py`'s. Metrics: `val/<category>/<column>` and `val/all/<column>` (the results table's columns:
accuracy, reward, search ratios, failure ratios; `agent/mmsearch/metrics.py`), `val/n`, `val/errors`. The full
table (by data source and category) is kept as markdown for the trainer to print. Image searches of the validation
questions read `tools.image_search.val_cache_path` when set (the training cache rarely holds the test questions).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rlinf_ext.agent.mmsearch.metrics import ACCURACY, IMAGE_SEARCH_RATIO, summary_by_category
from rlinf_ext.eval.core.runner import eval_concurrency, run_with_http_session, sampling_params_from_config
from rlinf_ext.eval.core.validation import sample_items, validation_records
from rlinf_ext.eval.mmsearch.records import GenerationRecord
from rlinf_ext.eval.mmsearch.results import markdown, table
from rlinf_ext.eval.mmsearch.runner import evaluator, load_tasks, make_rollout_fn, search_tools
from rlinf_ext.generation.hf_vl import load_vl_processor
from rlinf_ext.protocol import metric_keys as mk

DEFAULT_SAMPLES_PER_BENCHMARK = 64


def validation_image_search(section: Any) -> Any:
    """`tools.image_search` with `val_cache_path` as its cache, when set."""
    if section.val_cache_path is None:
        return section
    return dataclasses.replace(section, cache_path=section.val_cache_path)


def validation_metrics(records: list[GenerationRecord], prefix: str = mk.VAL_PREFIX) -> dict[str, float]:
    """`<prefix>/<category>/<column>`, `<prefix>/all/<column>`, `<prefix>/n`, `<prefix>/errors`; a question whose
    rollout raised counts with score 0 (as in the results table)."""
    rows = [{**r.table_row(), "category": r.category} for r in records]
    metrics = summary_by_category(rows, prefix=prefix)
    metrics[f"{prefix}/n"] = float(len(records))
    metrics[f"{prefix}/errors"] = float(sum(r.error is not None for r in records))
    return metrics


class ValidationPass:
    """Built once by the trainer (the agent registry's ``validation``); ``run(step)`` evaluates the subset."""

    def __init__(
        self,
        cfg: Any,
        generator,
        processor=None,
        tools=None,
        samples_per_benchmark: int | None = DEFAULT_SAMPLES_PER_BENCHMARK,
        do_sample: bool = False,
        out_dir: str | Path | None = None,
        show_progress: bool = False,
    ):
        self.cfg = cfg
        self.processor = processor if processor is not None else load_vl_processor(str(cfg.rollout.model.model_path))
        self.items = sample_items(
            load_tasks(cfg), samples_per_benchmark, seed=int(cfg.data.seed), benchmark=lambda item: item[0]
        )
        tools = tools if tools is not None else search_tools(cfg, validation_image_search(cfg.tools.image_search))
        params = sampling_params_from_config(cfg, do_sample=do_sample)
        self.rollout = make_rollout_fn(cfg, generator, self.processor, tools, params)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.show_progress = show_progress
        self.table_md = ""  # the last pass's table by data source and category

    async def arun(self, step: int) -> dict[str, float]:
        records = await validation_records(
            self.items,
            evaluator(self.rollout, self.processor.tokenizer.decode),
            self.out_dir,
            step,
            concurrency=eval_concurrency(self.cfg),
            show_progress=self.show_progress,
        )
        self.table_md = markdown(table(records))
        return validation_metrics(records)

    def run(self, step: int) -> dict[str, float]:
        """Synchronous form for callers without a running event loop (closes its HTTP session at the end)."""
        return run_with_http_session(lambda: self.arun(step))

    def summary(self, metrics: dict[str, float]) -> str:
        """The trainer's report of a pass: accuracy and image-search ratio per category, then the table."""
        categories = sorted({k.split("/")[1] for k in metrics if k.endswith(f"/{ACCURACY}")})
        parts = [
            f"{c} accuracy {metrics[mk.mm_category_metric(c, ACCURACY, mk.VAL_PREFIX)]:.3f} image-search "
            f"{metrics.get(mk.mm_category_metric(c, IMAGE_SEARCH_RATIO, mk.VAL_PREFIX), float('nan')):.3f}"
            for c in categories
        ]
        head = (
            f"{'; '.join(parts)} over {int(metrics.get(mk.VAL_N, 0))} questions "
            f"({int(metrics.get(mk.VAL_ERRORS, 0))} errors)"
        )
        return head + ("\n" + self.table_md if self.table_md else "")
