"""The evaluation loop: roll out each question, score it, append it to generations.jsonl as it finishes.

The rollout is a callable `item -> Trajectory` (``agent/core/types.py:Trajectory``), so the loop does not care whether the agent
runs in-process on CPU or through a rollout group on GPUs. Benchmarks are run one after another with one
tqdm bar each; questions of a benchmark run concurrently, at most `concurrency` at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tqdm.auto import tqdm

from rlinf_ext.agent.core.types import Trajectory
from rlinf_ext.config.schema import RewardConfig
from rlinf_ext.eval.benchmarks import display_name, paper_sorted
from rlinf_ext.eval.dataset import EvalItem
from rlinf_ext.eval.generations import GenerationsWriter
from rlinf_ext.eval.records import GenerationRecord, TurnLog
from rlinf_ext.rewards import searchr1_reward

logger = logging.getLogger(__name__)

RolloutFn = Callable[[EvalItem], Awaitable[Trajectory]]
Decode = Callable[[list[int]], str]


def record_from_trajectory(item: EvalItem, traj: Trajectory, decode: Decode, reward_cfg: RewardConfig | None = None) -> GenerationRecord:
    """Everything a reader needs about one question: turns with their observations, answer, scores."""
    turns = [
        TurnLog(
            output=t.text,
            observation=decode(list(t.observation_ids)) if t.observation_ids else None,
            action=t.action,
        )
        for t in traj.turns
    ]
    num_searches = sum(1 for t in traj.turns if t.action == "search")
    result = searchr1_reward(traj.generated_text, item.golden_answers, reward_cfg, num_searches=num_searches)
    return GenerationRecord(
        benchmark=item.benchmark,
        item_id=item.item_id,
        question=item.question,
        prompt=item.prompt,
        golden_answers=list(item.golden_answers),
        turns=turns,
        response=traj.response_text,
        final_answer=result.answer,
        scores={"em": result.em, "subem": result.subem, "f1": result.f1, "reward": result.score},
        num_turns=len(traj.turns),
        num_searches=num_searches,
        search_failures=sum(1 for t in traj.turns if t.action == "search" and t.search_ok is False),
        response_length=len(traj.response_ids),
    )


def error_record(item: EvalItem, exc: BaseException) -> GenerationRecord:
    return GenerationRecord(
        benchmark=item.benchmark,
        item_id=item.item_id,
        question=item.question,
        prompt=item.prompt,
        golden_answers=list(item.golden_answers),
        error=f"{type(exc).__name__}: {exc}",
    )


async def _evaluate_one(item, rollout_fn, decode, reward_cfg, semaphore) -> GenerationRecord:
    async with semaphore:
        try:
            traj = await rollout_fn(item)
        except Exception as exc:  # one bad question must not lose the others; it is retried on resume
            logger.warning("question %s/%s failed: %s", item.benchmark, item.item_id, exc)
            return error_record(item, exc)
    return record_from_trajectory(item, traj, decode, reward_cfg)


async def evaluate_items(
    items: list[EvalItem],
    rollout_fn: RolloutFn,
    decode: Decode,
    writer: GenerationsWriter,
    skip: set[tuple[str, str]] = frozenset(),
    concurrency: int = 8,
    reward_cfg: RewardConfig | None = None,
    show_progress: bool = True,
) -> list[GenerationRecord]:
    """Evaluate the items not in `skip`; every finished record is written before the next one is awaited."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    by_bench: dict[str, list[EvalItem]] = {}
    for item in items:
        by_bench.setdefault(item.benchmark, []).append(item)
    semaphore = asyncio.Semaphore(concurrency)
    new_records: list[GenerationRecord] = []
    for bench in paper_sorted(by_bench):
        todo = [it for it in by_bench[bench] if (it.benchmark, it.item_id) not in skip]
        done_before = len(by_bench[bench]) - len(todo)
        bar = tqdm(
            total=len(by_bench[bench]),
            initial=done_before,
            desc=f"eval {display_name(bench)}",
            unit="q",
            disable=not show_progress,
        )
        tasks = [asyncio.ensure_future(_evaluate_one(it, rollout_fn, decode, reward_cfg, semaphore)) for it in todo]
        try:
            for next_done in asyncio.as_completed(tasks):
                record = await next_done
                writer.write(record)
                new_records.append(record)
                bar.update(1)
                bar.set_postfix(em=f"{_running_em(new_records, bench):.3f}")
        finally:
            for task in tasks:  # interrupted: do not leave rollouts running in the background
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            bar.close()
    return new_records


def _running_em(records: list[GenerationRecord], bench: str) -> float:
    mine = [r.scores.get("em", 0.0) for r in records if r.benchmark == bench]
    return sum(mine) / len(mine) if mine else 0.0
