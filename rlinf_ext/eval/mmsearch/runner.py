"""`run_evaluation(cfg)`: evaluate a Qwen2.5-VL model on FVQA-format files with the MMSearch-R1 loop.

Flow: read `data.val_data_paths` (FVQA parquet, images canonicalised by `data.image_{min,max}_pixels`,
`data.data_size` per file) -> skip questions already in `RUN_DIR/generations.jsonl` -> roll out the rest with the
same loop, tools and reward as training (one progress bar) -> append each record as it finishes -> score every
saved record of this question set -> results.{json,md,csv}: a row per data source and category (accuracy, mean
reward, image/text/mixed search ratios, search failure ratios). The loop, resume and run directory are
`eval.core`'s; `eval.entry.evaluate_agent` dispatches here for agent mmsearch (the agent registry says so).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rlinf_ext.agent.mmsearch.loop import LoopSettings, SearchTools, first_prompt_ids, run_trajectory
from rlinf_ext.agent.mmsearch.metrics import reward_fn
from rlinf_ext.agent.mmsearch.prompts import Prompts
from rlinf_ext.agent.mmsearch.types import Task, VLTrajectory
from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.eval.core.loop import Evaluator, evaluate_run, one_bar
from rlinf_ext.eval.core.results import RESULTS_MD
from rlinf_ext.eval.core.runner import (
    EvalError,
    EvalSummary,
    build_generator,
    check_same_setup,
    eval_concurrency,
    eval_run_dir,
    needs_rollouts,
    run_with_http_session,
    sampling_params_from_config,
)
from rlinf_ext.eval.mmsearch.records import GenerationRecord, error_record, record_of
from rlinf_ext.eval.mmsearch.results import tabulate
from rlinf_ext.generation.hf_vl import load_vl_processor
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.tools.image_search import ImageSearch
from rlinf_ext.tools.registry import build_tools

Item = tuple[str, Task]  # (benchmark = the file's stem, task)


def load_tasks(cfg: Any) -> list[Item]:
    """(benchmark = file stem, task) for every row of every `data.val_data_paths` file."""
    data, mm = cfg.data, cfg.agentloop.mmsearch
    limit = None if int(data.data_size) < 0 else int(data.data_size)
    out = []
    for path in data.val_data_paths:
        rows = read_fvqa(path, int(mm.image_min_pixels), int(mm.image_max_pixels), limit=limit)
        out += [(Path(path).stem, Task.from_row(r)) for r in rows]
    return out


def search_tools(cfg: Any, image_search: Any = None) -> SearchTools:
    """The two search tools of `cfg.tools` (`image_search`: another `tools.image_search` section, e.g. the
    validation questions' cache)."""
    (text_search,) = build_tools(["search"], cfg)
    return SearchTools(ImageSearch(image_search if image_search is not None else cfg.tools.image_search), text_search)


RolloutFn = Callable[[Task], Awaitable[VLTrajectory]]


def make_rollout_fn(cfg: Any, generator, processor, tools: SearchTools, params: SamplingParams) -> RolloutFn:
    """task -> scored trajectory through the training loop, tools and reward (one trajectory per question)."""
    settings, prompts = LoopSettings.from_config(cfg.agentloop), Prompts.from_config(cfg.agentloop.mmsearch.prompts)
    reward = reward_fn(cfg.reward, shaping=cfg.agentloop.mmsearch.reward)

    async def rollout(task: Task) -> VLTrajectory:
        ids = first_prompt_ids(processor, prompts, task)
        return await run_trajectory(
            generator,
            processor,
            tools,
            task,
            settings,
            prompts=prompts,
            sampling_params=params,
            uid=task.data_id,
            prompt_ids=ids,
            reward_fn=reward,
        )

    return rollout


def evaluator(rollout: Callable[[Task], Awaitable[VLTrajectory]], decode: Callable[[list[int]], str]) -> Evaluator:
    """The MMSearch-R1 part of the evaluation loop: (benchmark, task) items keyed by (benchmark, data_id)."""
    return Evaluator(
        record_type=GenerationRecord,
        key=lambda item: (item[0], item[1].data_id),
        rollout=lambda item: rollout(item[1]),
        record=lambda item, traj: record_of(item[0], item[1], traj, decode),
        error_record=lambda item, exc: error_record(item[0], item[1], exc),
        bars=one_bar("eval mmsearch"),
    )


def run_evaluation(
    cfg: Any,
    generator=None,
    *,
    run_dir: str | Path | None = None,
    do_sample: bool | None = None,
    tools: SearchTools | None = None,
    show_progress: bool = True,
    print_table: bool = True,
) -> EvalSummary:
    """Evaluate `rollout.model.model_path` on the FVQA files of `data.val_data_paths` (module docstring)."""
    model_path = str(cfg.rollout.model.model_path)
    try:
        processor = load_vl_processor(model_path)
    except (OSError, ValueError) as exc:
        raise EvalError(
            f"rollout.model.model_path={model_path!r}: no Qwen2.5-VL processor could be loaded ({exc})"
        ) from exc
    tasks = load_tasks(cfg)
    params = sampling_params_from_config(cfg, do_sample)
    out = Path(run_dir) if run_dir is not None else eval_run_dir(cfg)
    check_same_setup(out, {"model_path": model_path, "do_sample": params.do_sample, "temperature": params.temperature})
    if generator is None and needs_rollouts(out, GenerationRecord, ((b, t.data_id) for b, t in tasks)):
        generator = build_generator(cfg, vision=True)  # not loaded at all when a rerun finds every question done
    tools = tools or search_tools(cfg)
    rollout = make_rollout_fn(cfg, generator, processor, tools, params)
    meta = {
        "experiment_name": str(cfg.runner.experiment_name),
        "model_path": model_path,
        "do_sample": params.do_sample,
        "temperature": params.temperature,
        "image_search": tools.image_search.metadata(),
        "text_search_backend": str(cfg.tools.search.backend),
        "max_gen_round": int(cfg.agentloop.mmsearch.max_gen_round),
    }
    summary = run_with_http_session(
        lambda: evaluate_run(
            tasks,
            evaluator(rollout, lambda ids: processor.tokenizer.decode(ids)),
            tabulate,
            out,
            meta,
            concurrency=eval_concurrency(cfg),
            show_progress=show_progress,
        )
    )
    if print_table:
        print(
            "\n" + summary.table_md + f"[eval] {summary.evaluated} question(s) evaluated, {summary.resumed} resumed, "
            f"{summary.errors} failed; table {summary.result_files[RESULTS_MD]}; generations {summary.generations_path}",
            flush=True,
        )
    return summary
