"""`run_evaluation(cfg, generator=None)`: evaluate a model on every benchmark file of an eval config.

Flow: read the benchmark files (`data.val_data_paths`, `data.data_size` per file) -> skip the questions
already in `RUN_DIR/generations.jsonl` -> roll out the rest with the training agent loop, search tool and
reward -> aggregate every saved generation of this question set -> write results.{json,md,csv}.
RUN_DIR is `runner.output_dir/runner.experiment_name`, the same place the launcher reports.

Decoding follows `algorithm.sampling_params` (the eval YAMLs set `do_sample: false`, Search-R1's greedy
validation); `do_sample=` overrides it for one call.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinf_ext.agent.searchr1.loop import run_trajectory
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.eval.dataset import EvalItem, load_eval_items
from rlinf_ext.eval.generations import (
    GENERATIONS_FILE,
    GenerationsWriter,
    completed_keys,
    read_generations,
)
from rlinf_ext.eval.loop import RolloutFn, evaluate_items
from rlinf_ext.eval.records import GenerationRecord
from rlinf_ext.eval.results import RESULTS_MD, markdown_table, paper_table_rows, write_results
from rlinf_ext.eval.scoring import Aggregate, aggregate
from rlinf_ext.generation.hf import HFGenerator
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.tools import SearchTool, close_http_session

RUN_INFO_FILE = "eval_run.json"


class EvalError(RuntimeError):
    """The evaluation cannot start or its results would be wrong; the message says why and what to do."""


@dataclass
class EvalSummary:
    run_dir: Path
    aggregate: Aggregate
    result_files: dict[str, Path]
    generations_path: Path
    evaluated: int  # questions rolled out by this call
    resumed: int  # questions taken from an earlier run's generations.jsonl
    errors: int  # questions whose rollout raised in this call (retried by the next run)
    seconds: float
    table_md: str = field(repr=False, default="")


def eval_run_dir(cfg: ExperimentConfig) -> Path:
    return Path(cfg.runner.output_dir) / cfg.runner.experiment_name


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


def build_generator(cfg: ExperimentConfig) -> HFGenerator:
    """The in-process CPU engine (protocol/generation.py); GPU runs pass the rollout group's generator instead."""
    if cfg.rollout.rollout_backend != "hf":
        raise EvalError(
            f"rollout.rollout_backend={cfg.rollout.rollout_backend!r}: run_evaluation builds only the CPU 'hf' "
            "engine itself; pass generator=groups.rollout_generator(groups) (the launcher's `rlinf-ext eval` does)"
        )

    hf = cfg.rollout.hf
    return HFGenerator.from_pretrained(
        str(cfg.rollout.model.model_path), dtype=hf.dtype, max_batch_size=int(hf.max_batch_size), seed=int(cfg.runner.seed)
    )


def sampling_params_from_config(cfg: ExperimentConfig, do_sample: bool | None = None):
    overrides = {} if do_sample is None else {"do_sample": bool(do_sample)}
    return SamplingParams.from_config(cfg.algorithm.sampling_params, **overrides)


def make_rollout_fn(cfg: Any, generator, tokenizer, search_tool, sampling_params) -> RolloutFn:
    """item -> Trajectory through the same agent loop as training (group of one per question)."""
    async def rollout(item: EvalItem):
        prompt_ids = tokenizer(item.prompt, add_special_tokens=False)["input_ids"]
        return await run_trajectory(
            generator,
            tokenizer,
            prompt_ids,
            item.golden_answers,
            cfg.agentloop,
            search_tool,
            sampling_params=sampling_params,
            uid=f"{item.benchmark}:{item.item_id}",
        )

    return rollout


def _check_same_model(run_dir: Path, info: dict[str, Any]) -> None:
    """Refuse to mix generations of two models (or decodings) in one generations.jsonl."""
    path = run_dir / RUN_INFO_FILE
    generations = run_dir / GENERATIONS_FILE
    if path.exists() and generations.exists() and generations.stat().st_size > 0:
        before = json.loads(path.read_text(encoding="utf-8"))
        changed = {k: (before.get(k), v) for k, v in info.items() if before.get(k) != v}
        if changed:
            details = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise EvalError(
                f"{run_dir} holds generations of a different setup ({details}); resuming would mix them. "
                "Use another runner.experiment_name, or delete that directory to start over."
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def eval_concurrency(cfg: Any) -> int:
    """Questions in flight: `data.val_rollout_batch_size` (null = `data.rollout_batch_size`)."""
    data = cfg.data
    size = data.val_rollout_batch_size if data.val_rollout_batch_size is not None else data.rollout_batch_size
    return max(1, int(size))


async def evaluate_async(
    cfg: Any,
    items: list[EvalItem],
    rollout_fn: RolloutFn,
    decode,
    run_dir: Path,
    meta: dict[str, Any],
    show_progress: bool = True,
) -> EvalSummary:
    """Resume-aware evaluation of `items` into `run_dir` with any rollout function (the testable core)."""
    started = time.monotonic()
    gen_path = run_dir / GENERATIONS_FILE
    skip = completed_keys(read_generations(gen_path))
    wanted = {(it.benchmark, it.item_id) for it in items}
    resumed = len(skip & wanted)
    with GenerationsWriter(gen_path) as writer:
        new = await evaluate_items(
            items, rollout_fn, decode, writer, skip=skip, concurrency=eval_concurrency(cfg),
            reward_cfg=cfg.reward, show_progress=show_progress,
        )
    # The file is the source of truth: score every saved generation of this question set, old and new.
    records: list[GenerationRecord] = [r for r in read_generations(gen_path) if r.key in wanted]
    agg = aggregate(records)
    paths = write_results(run_dir, agg, {**meta, "questions": len(items), "resumed": resumed})
    return EvalSummary(
        run_dir=run_dir,
        aggregate=agg,
        result_files=paths,
        generations_path=gen_path,
        evaluated=len(new),
        resumed=resumed,
        errors=sum(1 for r in new if r.error is not None),
        seconds=time.monotonic() - started,
        table_md=paths[RESULTS_MD].read_text(encoding="utf-8"),
    )


def run_evaluation(
    cfg: Any,
    generator=None,
    *,
    run_dir: str | Path | None = None,
    do_sample: bool | None = None,
    search_tool=None,
    show_progress: bool = True,
    print_table: bool = True,
) -> EvalSummary:
    """Evaluate `rollout.model.model_path` on `data.val_data_paths`; see the module docstring.

    `cfg` is the validated experiment config (attribute access). `generator` is any ``protocol.generation.Generator``;
    None builds the CPU `HFGenerator` in-process (only for `rollout.rollout_backend: hf`). The search tool
    is built from `tools.search` unless given. Call from synchronous code (it runs its own event loop).
    """
    model_path = str(cfg.rollout.model.model_path)
    tokenizer = load_tokenizer(model_path)
    items = items_from_config(cfg, tokenizer)
    params = sampling_params_from_config(cfg, do_sample)
    out = Path(run_dir) if run_dir is not None else eval_run_dir(cfg)
    info = {"model_path": model_path, "do_sample": params.do_sample, "temperature": params.temperature}
    _check_same_model(out, info)
    done = completed_keys(read_generations(out / GENERATIONS_FILE))
    if generator is None and any((it.benchmark, it.item_id) not in done for it in items):
        generator = build_generator(cfg)  # not loaded at all when a rerun finds every question done
    tool = search_tool if search_tool is not None else SearchTool(cfg.tools.search, seed=int(cfg.runner.seed))
    meta = {
        "experiment_name": str(cfg.runner.experiment_name),
        "model_path": model_path,
        "do_sample": params.do_sample,
        "temperature": params.temperature,
        "max_turns": int(cfg.agentloop.max_turns),
        "topk": int(cfg.tools.search.topk),
        "data_size": int(cfg.data.data_size),
    }
    rollout = make_rollout_fn(cfg, generator, tokenizer, tool, params)

    async def main() -> EvalSummary:
        try:
            return await evaluate_async(cfg, items, rollout, tokenizer.decode, out, meta, show_progress)
        finally:
            await close_http_session()

    summary = asyncio.run(main())
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
