"""`run_evaluation(cfg, generator=None)`: evaluate a model on every Search-R1 benchmark file of an eval config.

Flow: read the benchmark files (`data.val_data_paths`, `data.data_size` per file) -> skip the questions
already in `RUN_DIR/generations.jsonl` -> roll out the rest with the training agent loop, search tool and
reward (one progress bar per benchmark, in the paper's order) -> aggregate every saved generation of this
question set -> write results.{json,md,csv}. The loop, resume and run directory are `eval.core`'s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rlinf_ext.agent.core.types import Trajectory
from rlinf_ext.agent.searchr1.config import LoopSettings, loop_section
from rlinf_ext.agent.searchr1.loop import run_trajectory
from rlinf_ext.config.schema import ExperimentConfig, RewardConfig
from rlinf_ext.eval.core.loop import Evaluator, evaluate_run
from rlinf_ext.eval.core.results import RESULTS_MD, markdown_table
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
from rlinf_ext.eval.searchr1.benchmarks import display_name, paper_sorted
from rlinf_ext.eval.searchr1.dataset import EvalItem, load_eval_items
from rlinf_ext.eval.searchr1.records import Decode, GenerationRecord, error_record, record_from_trajectory
from rlinf_ext.eval.searchr1.results import paper_table_rows, tabulate
from rlinf_ext.protocol.engines import engine_dtype
from rlinf_ext.tools.base import Tool
from rlinf_ext.tools.registry import build_agent_tools


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except OSError as exc:
        raise EvalError(
            f"rollout.model.model_path={model_path!r}: no tokenizer could be loaded ({exc}); "
            "point it at a Hugging Face model directory (convert Megatron checkpoints with `rlinf-ext convert mg2hf`)"
        ) from exc


def chat_renderer(tokenizer):
    def render(messages: list[dict]) -> str:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    return render


def items_from_config(cfg: ExperimentConfig, tokenizer) -> list[EvalItem]:
    data = cfg.data
    return load_eval_items(
        list(data.val_data_paths),
        chat_renderer(tokenizer),
        prompt_key=data.prompt_key,
        answer_key=data.answer_key,
        apply_chat_template=bool(data.apply_chat_template),
        data_size=int(data.data_size),
    )


def eval_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """The settings besides the model that move EM (``results.SETTINGS``): recorded in the results, and a resumed
    run must share them."""
    section = loop_section(cfg)
    return {
        "max_turns": int(section.max_turns),
        "precision": engine_dtype(cfg),
        "on_no_action": str(section.on_no_action),
        "topk": int(cfg.tools.search.topk),
    }


RolloutFn = Callable[[EvalItem], Awaitable[Trajectory]]


def make_rollout_fn(cfg: Any, generator, tokenizer, tools: list[Tool], sampling_params) -> RolloutFn:
    """item -> Trajectory through the same agent loop and tools as training (group of one per question)."""

    async def rollout(item: EvalItem) -> Trajectory:
        prompt_ids = tokenizer(item.prompt, add_special_tokens=False)["input_ids"]
        return await run_trajectory(
            generator,
            tokenizer,
            prompt_ids,
            item.golden_answers,
            LoopSettings.from_config(cfg),
            tools,
            sampling_params=sampling_params,
            uid=f"{item.benchmark}:{item.item_id}",
        )

    return rollout


def _by_benchmark(items: list[EvalItem]) -> list[tuple[str, list[EvalItem]]]:
    """One progress bar per benchmark, in the paper's order."""
    by_bench: dict[str, list[EvalItem]] = {}
    for item in items:
        by_bench.setdefault(item.benchmark, []).append(item)
    return [(f"eval {display_name(b)}", by_bench[b]) for b in paper_sorted(by_bench)]


def _running_em(records: list[GenerationRecord]) -> dict[str, str]:
    em = [r.scores.get("em", 0.0) for r in records]
    return {"em": f"{sum(em) / len(em) if em else 0.0:.3f}"}


def evaluator(
    rollout_fn: RolloutFn, decode: Decode, reward_cfg: RewardConfig | None = None, tool_tags: list[str] | None = None
) -> Evaluator:
    """The Search-R1 part of the evaluation loop: items keyed by (benchmark, item_id), scored with the reward
    (``tool_tags``: the configured tools' tags the format score accepts; None = Search-R1's)."""
    return Evaluator(
        record_type=GenerationRecord,
        key=lambda item: (item.benchmark, item.item_id),
        rollout=rollout_fn,
        record=lambda item, traj: record_from_trajectory(item, traj, decode, reward_cfg, tool_tags),
        error_record=error_record,
        bars=_by_benchmark,
        postfix=_running_em,
    )


async def evaluate_async(
    cfg: Any,
    items: list[EvalItem],
    rollout_fn: RolloutFn,
    decode: Decode,
    run_dir: Path,
    meta: dict[str, Any],
    show_progress: bool = True,
    tool_tags: list[str] | None = None,
) -> EvalSummary:
    """Resume-aware evaluation of `items` into `run_dir` with any rollout function (the testable core);
    `tool_tags`: the tags of the tools the rollouts call (None = Search-R1's)."""
    return await evaluate_run(
        items,
        evaluator(rollout_fn, decode, cfg.reward, tool_tags),
        tabulate,
        run_dir,
        meta,
        concurrency=eval_concurrency(cfg),
        show_progress=show_progress,
    )


def run_evaluation(
    cfg: Any,
    generator=None,
    *,
    run_dir: str | Path | None = None,
    do_sample: bool | None = None,
    tools: list[Tool] | None = None,
    show_progress: bool = True,
    print_table: bool = True,
) -> EvalSummary:
    """Evaluate `rollout.model.model_path` on `data.val_data_paths`; see the module docstring.

    `cfg` is the validated experiment config (attribute access). `generator` is any ``protocol.generation.Generator``;
    None builds the chosen engine's in-process generator (``eval/core/runner.py:build_generator``). The tools are built
    from `agentloop.searchr1.tools` unless given. Call from synchronous code (it runs its own event loop).
    """
    model_path = str(cfg.rollout.model.model_path)
    tokenizer = load_tokenizer(model_path)
    items = items_from_config(cfg, tokenizer)
    params = sampling_params_from_config(cfg, do_sample)
    out = Path(run_dir) if run_dir is not None else eval_run_dir(cfg)
    settings = eval_settings(cfg)
    check_same_setup(
        out, {"model_path": model_path, "do_sample": params.do_sample, "temperature": params.temperature, **settings}
    )
    if generator is None and needs_rollouts(out, GenerationRecord, ((it.benchmark, it.item_id) for it in items)):
        generator = build_generator(cfg, vision=False)  # not loaded at all when a rerun finds every question done
    tools = tools if tools is not None else build_agent_tools(cfg)
    meta = {
        "experiment_name": str(cfg.runner.experiment_name),
        "model_path": model_path,
        "do_sample": params.do_sample,
        "temperature": params.temperature,
        **settings,
        "data_size": int(cfg.data.data_size),
    }
    rollout = make_rollout_fn(cfg, generator, tokenizer, tools, params)
    summary = run_with_http_session(
        lambda: evaluate_async(
            cfg, items, rollout, tokenizer.decode, out, meta, show_progress, [tool.tag_name() for tool in tools]
        )
    )
    if print_table:
        print(format_summary(summary), flush=True)
    return summary


def format_summary(summary: EvalSummary) -> str:
    """The paper-layout table and where the files are, for the end of a run's output."""
    header, rows = paper_table_rows(summary.aggregate)
    lines = [
        "",
        markdown_table(header, rows),
        f"[eval] {summary.evaluated} question(s) evaluated, {summary.resumed} resumed from earlier runs, "
        f"{summary.errors} failed (retried by a rerun), {summary.seconds:.1f} s",
        f"[eval] table  : {summary.result_files[RESULTS_MD]}",
        f"[eval] results: {summary.run_dir / 'results.json'} / results.csv",
        f"[eval] generations: {summary.generations_path}",
    ]
    return "\n".join(lines)
