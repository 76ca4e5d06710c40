"""The evaluation loop every agent runs: roll out each question, record it, append it to generations.jsonl as it
finishes; rerun, it skips the questions already done and retries the failed ones.

What differs per agent comes in an `Evaluator`: how a question is keyed and rolled out (a callable, so the loop does
not care whether the agent runs in-process on CPU or through a rollout group on GPUs), what its record holds, and
how the questions are split over progress bars (one tqdm bar each, run one after another; the questions of a bar
run concurrently, at most `concurrency` at a time). `evaluate_run` adds the run directory around it: resume, then
score every saved generation of the question set with the agent's `Tabulate`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from tqdm.auto import tqdm

from rlinf_ext.eval.core.generations import GENERATIONS_FILE, GenerationsWriter, completed_keys, read_generations
from rlinf_ext.eval.core.records import EvalRecord
from rlinf_ext.eval.core.runner import EvalSummary

logger = logging.getLogger(__name__)

Item = TypeVar("Item")  # one question, as the agent's data reader gives it
R = TypeVar("R", bound=EvalRecord)


def one_bar(label: str) -> Callable[[list[Any]], list[tuple[str, list[Any]]]]:
    """All questions under one progress bar called `label`."""
    return lambda items: [(label, list(items))]


@dataclass(frozen=True)
class Evaluator(Generic[Item, R]):
    """One agent's part of the loop."""

    record_type: type[R]
    key: Callable[[Item], tuple[str, str]]  # (benchmark, item_id): the resume key
    rollout: Callable[[Item], Awaitable[Any]]  # the agent's trajectory for a question; may raise (-> error record)
    record: Callable[[Item, Any], R]  # the record of a question and its trajectory
    error_record: Callable[[Item, BaseException], R]  # the record of a question whose rollout raised
    bars: Callable[[list[Item]], list[tuple[str, list[Item]]]] = one_bar("eval")  # (label, questions) per progress bar
    postfix: Callable[[list[R]], dict[str, str]] | None = None  # shown on a bar, from its records so far

    async def evaluate_one(self, item: Item, semaphore: asyncio.Semaphore) -> R:
        async with semaphore:
            try:
                traj = await self.rollout(item)
            except Exception as exc:  # one bad question must not lose the others; it is retried on resume
                benchmark, item_id = self.key(item)
                logger.warning("question %s/%s failed: %s", benchmark, item_id, exc)
                return self.error_record(item, exc)
        return self.record(item, traj)


async def evaluate_items(
    items: Sequence[Item],
    evaluator: Evaluator[Item, R],
    writer: GenerationsWriter,
    skip: set[tuple[str, str]] = frozenset(),
    concurrency: int = 8,
    show_progress: bool = True,
) -> list[R]:
    """Evaluate the items not in `skip`; every finished record is written before the next one is awaited. An
    interruption (Ctrl-C, a kill, an exception) cancels the questions in flight; the written ones stay."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    semaphore = asyncio.Semaphore(concurrency)
    new_records: list[R] = []
    for label, bar_items in evaluator.bars(list(items)):
        todo = [it for it in bar_items if evaluator.key(it) not in skip]
        bar = tqdm(
            total=len(bar_items), initial=len(bar_items) - len(todo), desc=label, unit="q", disable=not show_progress
        )
        tasks = [asyncio.ensure_future(evaluator.evaluate_one(it, semaphore)) for it in todo]
        bar_records: list[R] = []
        try:
            for next_done in asyncio.as_completed(tasks):
                record = await next_done
                writer.write(record)
                bar_records.append(record)
                bar.update(1)
                if evaluator.postfix is not None:
                    bar.set_postfix(**evaluator.postfix(bar_records))
        finally:
            new_records += bar_records
            for task in tasks:  # interrupted: do not leave rollouts running in the background
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            bar.close()
    return new_records


# score the records of a run, write its result files; -> (the table, the files by name, the table in markdown)
Tabulate = Callable[[Path, list[R], dict[str, Any]], tuple[Any, dict[str, Path], str]]


async def evaluate_run(
    items: Sequence[Item],
    evaluator: Evaluator[Item, R],
    tabulate: Tabulate,
    run_dir: Path,
    meta: dict[str, Any],
    concurrency: int,
    show_progress: bool = True,
) -> EvalSummary:
    """Resume-aware evaluation of `items` into `run_dir/generations.jsonl`, then the result files of every saved
    generation of this question set (`meta` plus the question and resumed counts go into them)."""
    started = time.monotonic()
    gen_path = run_dir / GENERATIONS_FILE
    skip = completed_keys(read_generations(gen_path, evaluator.record_type))
    wanted = {evaluator.key(it) for it in items}
    resumed = len(skip & wanted)
    with GenerationsWriter(gen_path) as writer:
        new = await evaluate_items(
            items, evaluator, writer, skip=skip, concurrency=concurrency, show_progress=show_progress
        )
    # The file is the source of truth: score every saved generation of this question set, old and new.
    records = [r for r in read_generations(gen_path, evaluator.record_type) if r.key in wanted]
    table, paths, table_md = tabulate(run_dir, records, {**meta, "questions": len(items), "resumed": resumed})
    return EvalSummary(
        run_dir=run_dir,
        aggregate=table,
        result_files=paths,
        generations_path=gen_path,
        evaluated=len(new),
        resumed=resumed,
        errors=sum(1 for r in new if r.error is not None),
        seconds=time.monotonic() - started,
        table_md=table_md,
    )
