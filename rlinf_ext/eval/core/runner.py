"""What every agent's `run_evaluation` does the same way around the loop: where the run lives, the decoding, how
many questions are in flight, refusing to mix two setups in one generations.jsonl, and running the loop in its own
event loop.

RUN_DIR is `runner.output_dir/runner.experiment_name`, the same place the launcher reports. Decoding follows
`algorithm.sampling_params` (the eval YAMLs set `do_sample: false`); `do_sample=` overrides it for one call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rlinf_ext.eval.core.generations import GENERATIONS_FILE, completed_keys, read_generations
from rlinf_ext.eval.core.records import EvalRecord
from rlinf_ext.protocol.engines import ENGINE_KEY, EngineError, engine_spec, make_generator
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.tools import close_http_session

RUN_INFO_FILE = "eval_run.json"
T = TypeVar("T")


class EvalError(RuntimeError):
    """The evaluation cannot start or its results would be wrong; the message says why and what to do."""


@dataclass
class EvalSummary:
    run_dir: Path
    aggregate: Any  # the agent's table: an `Aggregate` (Search-R1), rows (MMSearch-R1)
    result_files: dict[str, Path]
    generations_path: Path
    evaluated: int  # questions rolled out by this call
    resumed: int  # questions taken from an earlier run's generations.jsonl
    errors: int  # questions whose rollout raised in this call (retried by the next run)
    seconds: float
    table_md: str = field(repr=False, default="")


def build_generator(cfg: Any, vision: bool) -> Any:
    """The chosen engine's generator, started in this process, unless the launcher owns that engine (its
    subprocesses need a shutdown this call could not promise: the launcher's `rlinf-ext eval` passes it in)."""
    spec = engine_spec(cfg)
    if spec.started_by_launcher and spec.evaluates(vision):
        raise EvalError(
            f"{ENGINE_KEY}={spec.name!r}: run_evaluation starts in-process engines only; pass a started "
            f"{spec.title} generator (the launcher's `rlinf-ext eval` does)"
        )
    try:
        return make_generator(cfg, vision)
    except EngineError as exc:
        raise EvalError(str(exc)) from exc


def eval_run_dir(cfg: Any) -> Path:
    return Path(cfg.runner.output_dir) / cfg.runner.experiment_name


def sampling_params_from_config(cfg: Any, do_sample: bool | None = None) -> SamplingParams:
    overrides = {} if do_sample is None else {"do_sample": bool(do_sample)}
    return SamplingParams.from_config(cfg.algorithm.sampling_params, **overrides)


def eval_concurrency(cfg: Any) -> int:
    """Questions in flight: `data.val_rollout_batch_size` (null = `data.rollout_batch_size`)."""
    data = cfg.data
    size = data.val_rollout_batch_size if data.val_rollout_batch_size is not None else data.rollout_batch_size
    return max(1, int(size))


def check_same_setup(run_dir: Path, info: dict[str, Any]) -> None:
    """Refuse to mix generations of two models (or decodings) in one generations.jsonl; record `info` otherwise."""
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


def needs_rollouts(run_dir: Path, record_type: type[EvalRecord], keys: Iterable[tuple[str, str]]) -> bool:
    """Whether any question is not finished in `run_dir` yet (a rerun that finds all done loads no model)."""
    done = completed_keys(read_generations(run_dir / GENERATIONS_FILE, record_type))
    return any(key not in done for key in keys)


def run_with_http_session(main: Callable[[], Awaitable[T]]) -> T:
    """`asyncio.run(main())`, closing the tools' HTTP session at the end. Call from synchronous code."""

    async def wrapped() -> T:
        try:
            return await main()
        finally:
            await close_http_session()

    return asyncio.run(wrapped())
