"""`run_mm_evaluation(cfg)`: evaluate a Qwen2.5-VL model on FVQA-format files with the MMSearch-R1 loop.

Flow: read `data.val_data_paths` (FVQA parquet, images canonicalised by `data.image_{min,max}_pixels`,
`data.data_size` per file) -> skip questions already in `RUN_DIR/generations.jsonl` -> roll out the rest with
the same loop, tools and reward as training -> append each record as it finishes -> score every saved record
of this question set -> results.{json,md,csv}: a row per data source and category (accuracy, mean reward,
image/text/mixed search ratios, search failure ratios). `eval.entry.run_evaluation` dispatches here for agent mmsearch.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from rlinf_ext.agent.mmsearch.loop import MMLoopSettings, MMTools, first_prompt_ids, run_mm_trajectory
from rlinf_ext.agent.mmsearch.metrics import mm_reward_fn
from rlinf_ext.agent.mmsearch.prompts import MMPrompts
from rlinf_ext.agent.mmsearch.types import MMTask, MMTrajectory
from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.eval.generations import GENERATIONS_FILE, GenerationsWriter, completed_keys, read_generations
from rlinf_ext.eval.mm_records import MMGenerationRecord, MMTurnLog
from rlinf_ext.eval.mm_results import RESULTS_MD, markdown, mm_table, write_mm_results
from rlinf_ext.eval.runner import (
    EvalError,
    EvalSummary,
    _check_same_model,
    eval_concurrency,
    eval_run_dir,
    sampling_params_from_config,
)
from rlinf_ext.generation.hf_vl import HFVLGenerator, load_vl_processor
from rlinf_ext.tools import SearchTool, close_http_session
from rlinf_ext.tools.image_search import ImageSearchTool

logger = logging.getLogger(__name__)
_PAD_RUN = re.compile(r"(?:<\|image_pad\|>)+")


def load_mm_tasks(cfg: Any) -> list[tuple[str, MMTask]]:
    """(benchmark = file stem, task) for every row of every `data.val_data_paths` file."""
    data = cfg.data
    limit = None if int(data.data_size) < 0 else int(data.data_size)
    out = []
    for path in data.val_data_paths:
        rows = read_fvqa(path, int(data.image_min_pixels), int(data.image_max_pixels), limit=limit)
        out += [(Path(path).stem, MMTask.from_row(r)) for r in rows]
    return out


def build_vl_generator(cfg: Any):
    if cfg.rollout.rollout_backend != "hf":
        raise EvalError(f"rollout.rollout_backend={cfg.rollout.rollout_backend!r}: the MMSearch-R1 evaluation runs the "
                        "CPU 'hf' engine here; the SGLang image path is part of the GPU work (not built yet)")

    hf = cfg.rollout.hf
    return HFVLGenerator.from_pretrained(str(cfg.rollout.model.model_path), dtype=hf.dtype, num_threads=1,
                                         max_batch_size=int(hf.max_batch_size), seed=int(cfg.runner.seed))


def record_of(benchmark: str, task: MMTask, traj: MMTrajectory, decode) -> MMGenerationRecord:
    turns = [MMTurnLog(action=t.action, output=t.text, tool=t.tool, query=t.query, titles=list(t.titles),
                       image_sha1s=[i.sha1 for i in t.observation_images], search_ok=t.search_ok,
                       observation=_PAD_RUN.sub("<|image_pad|>", decode(t.observation_ids)) if t.observation_ids else None)
             for t in traj.turns]
    r, m = traj.reward_details, traj.metrics
    return MMGenerationRecord(
        benchmark=benchmark, item_id=task.data_id, question=task.question, data_source=task.data_source,
        category=task.category, golden_answers=list(task.answers), image_sha1s=[i.sha1 for i in task.images],
        turns=turns, final_answer=r.answer,
        scores={"correct": float(r.correct), "em": r.em, "subem": r.subem, "format": r.format_score, "reward": r.score},
        image_searches=int(m["image_searches"]), text_searches=int(m["text_searches"]),
        image_search_failures=int(m["image_search_failures"]), text_search_failures=int(m["text_search_failures"]),
        missing_images=int(m["missing_images"]), num_turns=len(traj.turns), response_length=len(traj.response_ids),
        end_reason=traj.end_reason)


def error_record(benchmark: str, task: MMTask, exc: BaseException) -> MMGenerationRecord:
    return MMGenerationRecord(benchmark=benchmark, item_id=task.data_id, question=task.question,
                              data_source=task.data_source, category=task.category, golden_answers=list(task.answers),
                              image_sha1s=[i.sha1 for i in task.images], error=f"{type(exc).__name__}: {exc}")


async def evaluate_mm_tasks(tasks, rollout, decode, writer: GenerationsWriter, skip: set, concurrency: int,
                            show_progress: bool) -> list[MMGenerationRecord]:
    """Roll out the tasks not in `skip`, at most `concurrency` at a time; each record is written as it ends."""
    semaphore = asyncio.Semaphore(max(1, concurrency))

    async def one(benchmark: str, task: MMTask) -> MMGenerationRecord:
        async with semaphore:
            try:
                return record_of(benchmark, task, await rollout(task), decode)
            except Exception as exc:  # one bad question must not lose the others; retried on resume
                logger.warning("question %s/%s failed: %s", benchmark, task.data_id, exc)
                return error_record(benchmark, task, exc)

    todo = [(b, t) for b, t in tasks if (b, t.data_id) not in skip]
    bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc="eval mmsearch", unit="q", disable=not show_progress)
    futures = [asyncio.ensure_future(one(b, t)) for b, t in todo]
    new: list[MMGenerationRecord] = []
    try:
        for done in asyncio.as_completed(futures):
            record = await done
            writer.write(record)
            new.append(record)
            bar.update(1)
    finally:
        for f in futures:  # interrupted: leave no rollout running in the background
            f.cancel()
        await asyncio.gather(*futures, return_exceptions=True)
        bar.close()
    return new


def run_mm_evaluation(cfg: Any, generator=None, *, run_dir: str | Path | None = None, do_sample: bool | None = None,
                      tools: MMTools | None = None, show_progress: bool = True, print_table: bool = True) -> EvalSummary:
    """Evaluate `rollout.model.model_path` on the FVQA files of `data.val_data_paths` (module docstring)."""

    started = time.monotonic()
    model_path = str(cfg.rollout.model.model_path)
    try:
        processor = load_vl_processor(model_path)
    except (OSError, ValueError) as exc:
        raise EvalError(f"rollout.model.model_path={model_path!r}: no Qwen2.5-VL processor could be loaded ({exc})") from exc
    tasks = load_mm_tasks(cfg)
    params = sampling_params_from_config(cfg, do_sample)
    out = Path(run_dir) if run_dir is not None else eval_run_dir(cfg)
    _check_same_model(out, {"model_path": model_path, "do_sample": params.do_sample, "temperature": params.temperature})
    gen_path = out / GENERATIONS_FILE
    skip = completed_keys(read_generations(gen_path, MMGenerationRecord))
    if generator is None and any((b, t.data_id) not in skip for b, t in tasks):
        generator = build_vl_generator(cfg)
    tools = tools or MMTools(ImageSearchTool(cfg.tools.image_search), SearchTool(cfg.tools.search, seed=int(cfg.runner.seed)))
    settings, prompts = MMLoopSettings.from_config(cfg.agentloop), MMPrompts.from_config(cfg.agentloop.mmsearch.prompts)
    reward = mm_reward_fn(cfg.reward)

    async def rollout(task: MMTask) -> MMTrajectory:
        ids = first_prompt_ids(processor, prompts, task)
        return await run_mm_trajectory(generator, processor, tools, task, settings, prompts=prompts,
                                       sampling_params=params, uid=task.data_id, prompt_ids=ids, reward_fn=reward)

    async def main() -> list[MMGenerationRecord]:

        try:
            with GenerationsWriter(gen_path) as writer:
                return await evaluate_mm_tasks(tasks, rollout, lambda ids: processor.tokenizer.decode(ids), writer,
                                               skip, eval_concurrency(cfg), show_progress)
        finally:
            await close_http_session()

    new = asyncio.run(main())
    wanted = {(b, t.data_id) for b, t in tasks}
    records = [r for r in read_generations(gen_path, MMGenerationRecord) if r.key in wanted]
    rows = mm_table(records)
    meta = {"experiment_name": str(cfg.runner.experiment_name), "model_path": model_path, "do_sample": params.do_sample,
            "temperature": params.temperature, "questions": len(tasks), "resumed": len(skip & wanted),
            "image_search": tools.image_search.metadata(), "text_search_backend": str(cfg.tools.search.backend),
            "max_gen_round": settings.max_gen_round}
    paths = write_mm_results(out, rows, meta)
    summary = EvalSummary(run_dir=out, aggregate=rows, result_files=paths, generations_path=gen_path,
                          evaluated=len(new), resumed=len(skip & wanted), errors=sum(r.error is not None for r in new),
                          seconds=time.monotonic() - started, table_md=markdown(rows))
    if print_table:
        print("\n" + summary.table_md + f"[eval] {summary.evaluated} question(s) evaluated, {summary.resumed} resumed, "
              f"{summary.errors} failed; table {paths[RESULTS_MD]}; generations {gen_path}", flush=True)
    return summary
