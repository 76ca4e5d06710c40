"""What every agent's validation during training shares: when a step validates, the fixed subset of questions,
and one pass of the evaluation loop into ``<out_dir>/global_step_<N>/generations.jsonl``.

An agent's pass (``eval/searchr1/validation.py:ValidationPass``, ``eval/mmsearch/validation.py:ValidationPass``,
named by the agent registry's ``validation``) builds its evaluator and turns the records into flat ``val/...``
metrics; it offers ``run(step) -> metrics`` and ``summary(metrics) -> str`` (the line the trainer prints).
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rlinf_ext.eval.core.generations import GENERATIONS_FILE, GenerationsWriter
from rlinf_ext.eval.core.loop import Evaluator, evaluate_items
from rlinf_ext.eval.core.records import EvalRecord
from rlinf_ext.protocol.agents import agent_spec

Item = TypeVar("Item")


VALIDATION_DIR = "validation"  # <run_dir>/validation/global_step_<N>/generations.jsonl


def validation_enabled(cfg: Any) -> bool:
    """Whether any step of the run validates (``should_validate`` true for some step): ``runner.val_before_train``
    or ``runner.val_check_interval > 0``, with ``data.val_data_paths`` set."""
    wanted = cfg.runner.val_before_train or cfg.runner.val_check_interval > 0
    return wanted and bool(cfg.data.val_data_paths)


def validation_pass_class(cfg: Any) -> type:
    """The agent's validation pass (``protocol/agents.py``: ``validation``)."""
    return agent_spec(cfg).load("validation")


def build_validation_pass(cfg: Any, generator: Any, run_dir: Path):
    """The agent's greedy validation pass over ``runner.val_samples_per_benchmark`` questions per benchmark,
    writing ``<run_dir>/validation/global_step_<N>/generations.jsonl``."""
    per_benchmark = cfg.runner.val_samples_per_benchmark
    if per_benchmark == 0:
        raise ValueError(
            "runner.val_samples_per_benchmark=0 leaves nothing to validate; "
            "use N > 0 questions per benchmark, or -1 for all of them."
        )
    return validation_pass_class(cfg)(
        cfg, generator, samples_per_benchmark=per_benchmark, do_sample=False, out_dir=run_dir / VALIDATION_DIR
    )


def should_validate(cfg: Any, step: int) -> bool:
    """Step 0 = before the first training step; step N>0 = after training step N."""
    runner = cfg.runner
    if step == 0:
        return bool(runner.val_before_train) and bool(list(cfg.data.val_data_paths))
    interval = int(runner.val_check_interval)
    return interval > 0 and step % interval == 0 and bool(list(cfg.data.val_data_paths))


def sample_items(
    items: Sequence[Item],
    per_benchmark: int | None,
    seed: int,
    benchmark: Callable[[Item], str] = lambda item: item.benchmark,
) -> list[Item]:
    """Up to `per_benchmark` questions of each benchmark (`benchmark(item)`), drawn with `seed`, kept in file
    order; None or < 0: all of them."""
    if per_benchmark is None or per_benchmark < 0:
        return list(items)
    rng = random.Random(seed)
    chosen: set[int] = set()
    positions: dict[str, list[int]] = {}
    for pos, item in enumerate(items):
        positions.setdefault(benchmark(item), []).append(pos)
    for bench_positions in positions.values():
        k = min(per_benchmark, len(bench_positions))
        chosen.update(rng.sample(bench_positions, k))
    return [items[pos] for pos in sorted(chosen)]


async def validation_records(
    items: Sequence[Item],
    evaluator: Evaluator,
    out_dir: Path | None,
    step: int,
    concurrency: int,
    show_progress: bool = False,
) -> list[EvalRecord]:
    """Evaluate every item once with the current weights; the records also go to
    `out_dir/global_step_<step>/generations.jsonl` (a temporary file when `out_dir` is None). A pass is one
    measurement, never resumed: an old file of the same step is replaced."""
    with tempfile.TemporaryDirectory() as tmp:
        base = out_dir if out_dir is not None else Path(tmp)
        path = base / f"global_step_{step}" / GENERATIONS_FILE
        if path.exists():
            path.unlink()
        with GenerationsWriter(path) as writer:
            return await evaluate_items(items, evaluator, writer, concurrency=concurrency, show_progress=show_progress)
