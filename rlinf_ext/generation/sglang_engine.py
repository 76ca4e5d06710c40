"""SGLang 0.5.23 engines: the engine arguments (``server_kwargs``, shared with the training worker
``workers/rollout_sglang.py``), and the evaluation engines. Requests and replies go through
``generation/sglang_wire.py``.

``SGLangEngineGenerator`` is a GPU ``Generator`` on SGLang's offline engine, for ``rlinf-ext eval`` on the
SGLang engine (written against sglang 0.5.23's sources, NOT GPU-verified); no Ray worker
group: in-process engines (their scheduler/detokenizer subprocesses own the GPUs) serve every concurrent
``generate`` call.

- Engine class: SGLang's own ``sglang.srt.entrypoints.engine.Engine``: 0.5.23 returns ``text`` and the exact
  ``output_ids`` together, so no patched tokenizer/detokenizer managers are needed.
- GPUs: ONE engine per ``rollout.tensor_parallel_size`` GPUs, each with ``dp_size=1`` and ``base_gpu_id`` = its
  first GPU (the training worker's layout: SGLang's weight updates refuse ``dp_size > 1``); requests go to the
  least busy engine. GPUs = the rollout's ranks in ``cluster.component_placement`` (``all`` =
  ``cluster.num_gpus_per_node``), on this node.
- Sampling: engine k's ``random_seed`` = ``runner.seed + k``; no per-request seeds (SGLang honours
  ``sampling_seed`` only with deterministic inference; evaluation is greedy).
- An engine serves ONE event loop (SGLang binds its handle loop to the loop of the first request): build a
  generator per ``run_evaluation`` call, and ``close()`` it (every engine's ``shutdown()``) when done.

sglang itself is imported only inside the functions that start an engine (``load_engine_class``): it is the
SGLang profile's package (``bash scripts/install.sh --sglang``), and importing it initialises CUDA.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from rlinf_ext.config.placement import placement_entries
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.generation.sglang_wire import hf_eos_ids, result_of_sglang, to_sglang_params
from rlinf_ext.models.dtypes import PRECISIONS, hf_name_of_precision
from rlinf_ext.protocol.engines import ENGINE_KEY, ENGINES, SGLANG, EngineUnavailable
from rlinf_ext.protocol.generation import GenerationResult, SamplingParams

SGLANG_INSTALL_FIX = ENGINES[SGLANG].install_fix


class SGLangUnavailable(EngineUnavailable):
    """SGLang cannot run here (no CUDA device, not installed, or a config it cannot serve); names the fix."""


def import_sglang(module: str, name: str, alternative: str = ""):
    """``from <module> import <name>`` from sglang, with one clear error when SGLang is unusable."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise SGLangUnavailable(
            f"SGLang is not usable here ({type(exc).__name__}: {exc}). Fix: on the GPU node, {SGLANG_INSTALL_FIX}"
            + (f"; or {alternative}." if alternative else ".")
        ) from exc


def server_kwargs(
    cfg: ExperimentConfig,
    *,
    tp_size: int,
    base_gpu_id: int = 0,
    seed: int,
    load_format: str = "auto",
    training: bool = False,
    memory_saver: bool = False,
) -> dict[str, Any]:
    """``Engine(**kwargs)`` (sglang 0.5.23's ``ServerArgs`` fields) of ONE SGLang engine for ``cfg.rollout``
    (pure), shared by the training worker and the evaluation engines. ``dp_size`` is always 1 (one engine per TP
    group: SGLang's weight updates refuse data-parallel replicas). ``load_format="dummy"`` starts with random
    weights when the first weight sync overwrites them all. Training engines release their memory to a
    collocated actor (``memory_saver``: SGLang's ``enable_memory_saver``) and detokenize only with
    ``rollout.detokenize`` (stop strings need the scheduler's tokenizer); evaluation engines always detokenize and
    log less."""
    rollout = cfg.rollout
    precision = str(rollout.model.precision)
    if precision not in PRECISIONS:
        raise SGLangUnavailable(f"rollout.model.precision={precision!r}: use one of {list(PRECISIONS)}.")
    max_running = int(rollout.max_running_requests)
    kwargs = {
        "model_path": str(rollout.model.model_path),
        "tp_size": int(tp_size),
        "dp_size": 1,
        "base_gpu_id": int(base_gpu_id),
        "load_format": load_format,
        "mem_fraction_static": float(rollout.gpu_memory_utilization),
        "dtype": hf_name_of_precision(precision),
        "random_seed": int(seed),
        "max_running_requests": max_running,
        "disable_cuda_graph": bool(rollout.enforce_eager),
        "cuda_graph_max_bs_decode": min(int(rollout.cuda_graph_max_bs), max_running),
        "attention_backend": str(rollout.sglang.attention_backend),
        "enable_torch_compile": bool(rollout.sglang.use_torch_compile),
        "torch_compile_max_bs": min(int(rollout.sglang.torch_compile_max_bs), max_running),
        "decode_log_interval": int(rollout.sglang.decode_log_interval),
    }
    if training:
        kwargs.update(
            enable_memory_saver=bool(memory_saver), skip_tokenizer_init=not bool(rollout.detokenize), log_level="info"
        )
        if int(cfg.runner.max_staleness) > 0:  # batches rolled out ahead: the oldest batch's requests first
            kwargs.update(enable_priority_scheduling=True, schedule_low_priority_values_first=True)
    else:
        kwargs.update(skip_tokenizer_init=False, log_level="warning")  # stop strings need the detokenizer
    return kwargs


def usable_gpus(cfg: ExperimentConfig, visible: int) -> list[int]:
    """The GPUs of this node the evaluation engine runs on: the ranks ``cluster.component_placement`` gives the
    rollout (``all`` = ``cluster.num_gpus_per_node``); all must be on this node and visible (pure)."""
    per_node = int(cfg.cluster.num_gpus_per_node)
    if per_node < 1:
        raise SGLangUnavailable("cluster.num_gpus_per_node=0 (a CPU cluster). Fix: use a GPU cluster profile.")
    entry = next(
        (e for e in placement_entries(cfg.cluster.component_placement, per_node) if "rollout" in e.components), None
    )  # ranks are read against one node: evaluation runs on this node only
    if entry is None:
        raise SGLangUnavailable("cluster.component_placement has no rollout entry. Fix: add e.g. `rollout: all`.")
    if entry.error is not None:
        raise SGLangUnavailable(f"cluster.component_placement.{entry.key} (evaluation runs on one node): {entry.error}")
    gpus = list(entry.ranks)
    if gpus[-1] >= visible:
        raise SGLangUnavailable(
            f"cluster.component_placement places the rollout on GPUs {gpus[0]}-{gpus[-1]}, but only "
            f"{visible} CUDA device(s) are visible here. Fix: set cluster.num_gpus_per_node={visible} (or give "
            "rollout ranks within the visible devices), or check CUDA_VISIBLE_DEVICES."
        )
    return gpus


def engine_kwargs(cfg: ExperimentConfig, gpus: list[int]) -> list[dict[str, Any]]:
    """``Engine(**kwargs)`` of each evaluation engine on the GPU ids ``gpus`` (pure): one engine per
    ``rollout.tensor_parallel_size`` consecutive GPUs (``base_gpu_id`` = its first), seeds ``runner.seed + k``."""
    rollout = cfg.rollout
    tp = int(rollout.tensor_parallel_size)
    if int(rollout.pipeline_parallel_size) != 1:
        raise SGLangUnavailable(
            f"rollout.pipeline_parallel_size={rollout.pipeline_parallel_size}: rlinf_ext starts SGLang engines with "
            "tensor parallelism only. Fix: set rollout.pipeline_parallel_size=1 (use rollout.tensor_parallel_size)."
        )
    if tp < 1 or len(gpus) < tp:
        raise SGLangUnavailable(
            f"rollout.tensor_parallel_size={tp} needs {tp} GPU(s) per engine, but {len(gpus)} are usable here. "
            "Fix: lower rollout.tensor_parallel_size or run on a node with more GPUs."
        )
    groups = [gpus[k : k + tp] for k in range(0, len(gpus) - len(gpus) % tp, tp)]  # leftover GPUs stay idle
    for group in groups:
        if group != list(range(group[0], group[0] + tp)):
            raise SGLangUnavailable(
                f"the TP group on GPUs {group} is not consecutive; an SGLang engine takes base_gpu_id, "
                "base_gpu_id+1, ... Fix: give the rollout consecutive GPU ranks in cluster.component_placement."
            )
    return [
        server_kwargs(cfg, tp_size=tp, base_gpu_id=group[0], seed=int(cfg.runner.seed) + k)
        for k, group in enumerate(groups)
    ]


def sglang_installed() -> bool:
    """Whether sglang can be found, without importing it (importing it initialises CUDA)."""
    return importlib.util.find_spec("sglang") is not None


def check_evaluation_engine(cfg: ExperimentConfig) -> None:
    """What ``rlinf-ext eval`` on SGLang needs here, checked before anything starts: a CUDA device, sglang, and
    the GPUs placed, the TP size and the precision (``SGLangUnavailable`` with the fix otherwise)."""
    if not torch.cuda.is_available():
        raise SGLangUnavailable(
            f"{ENGINE_KEY}='sglang' evaluates on GPUs, but no CUDA device is visible here. Fix: run `rlinf-ext eval` "
            f"on a GPU node with the SGLang profile ({SGLANG_INSTALL_FIX}), or set {ENGINE_KEY}=hf to evaluate on CPU."
        )
    if not sglang_installed():
        raise SGLangUnavailable(
            f"{ENGINE_KEY}='sglang': sglang is not installed. Fix: {SGLANG_INSTALL_FIX}, or set "
            f"{ENGINE_KEY}=hf to evaluate on CPU."
        )
    engine_kwargs(cfg, usable_gpus(cfg, torch.cuda.device_count()))


def load_engine_class() -> Callable[..., Any]:
    """SGLang's own ``Engine``; a clear error when SGLang is unusable."""
    return import_sglang("sglang.srt.entrypoints.engine", "Engine", f"set {ENGINE_KEY}=hf to evaluate on CPU")


class SGLangEngineGenerator:
    """`await gen.generate(prompt_ids, SamplingParams) -> GenerationResult` over one or more SGLang engines.

    ``engines``: one engine or a list (one per TP group); each has ``async_generate(input_ids=,
    sampling_params=, return_logprob=)`` returning SGLang's result dict, and ``shutdown()`` (tests pass fakes).
    A request goes to the engine with the fewest requests in flight (the lowest index on a tie), so a long
    generation does not hold back the requests queued behind it. ``decode`` turns ids into text when the
    engine returns no ``text``. ``eos_ids`` end a turn as EOS (``stop_token_ids``); stop strings are each
    request's own.
    """

    def __init__(
        self,
        engines: Any,
        decode: Callable[[list[int]], str],
        *,
        eos_ids: set[int] | list[int] | tuple[int, ...] = (),
        return_logprobs: bool = False,
    ):
        self.engines = list(engines) if isinstance(engines, (list, tuple)) else [engines]
        if not self.engines:
            raise ValueError("SGLangEngineGenerator needs at least one engine")
        self.in_flight = [0] * len(self.engines)
        self.served = [0] * len(self.engines)
        self.closed = False
        self.decode = decode
        self.eos_ids = sorted(int(i) for i in eos_ids)
        self.return_logprobs = return_logprobs

    @classmethod
    def from_config(
        cls,
        cfg: ExperimentConfig,
        *,
        gpus: list[int] | None = None,
        engine_factory: Callable[..., Any] | None = None,
    ) -> SGLangEngineGenerator:
        """Start one engine per TP group of ``cfg.rollout`` (blocks until every engine has loaded the model).

        ``gpus``: None = the rollout's GPUs from ``cluster.component_placement`` (``usable_gpus``).
        ``engine_factory``: None = SGLang's ``Engine``. Engines start one after the other (each
        binds its ports before the next picks its own); if one fails, those already started are shut down.
        """
        if gpus is None:
            gpus = usable_gpus(cfg, torch.cuda.device_count())
        all_kwargs = engine_kwargs(cfg, gpus)
        factory = engine_factory if engine_factory is not None else load_engine_class()
        model_path = all_kwargs[0]["model_path"]
        from transformers import AutoTokenizer  # heavy: only where an engine starts, never for the launcher's checks

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        print(
            f"[sglang] starting {len(all_kwargs)} engine(s) with tp_size={all_kwargs[0]['tp_size']} on GPUs "
            f"{', '.join(str(k['base_gpu_id']) for k in all_kwargs)} (first GPU of each), model {model_path}",
            flush=True,
        )
        engines: list[Any] = []
        try:
            for kwargs in all_kwargs:
                engines.append(factory(**kwargs))
        except BaseException:
            _shutdown_all(engines)
            raise
        return cls(
            engines,
            lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            eos_ids=hf_eos_ids(model_path, tokenizer),
            return_logprobs=bool(cfg.rollout.return_logprobs),
        )

    def sglang_params(self, sampling_params: SamplingParams) -> dict[str, Any]:
        """The ``sampling_params`` dict sent to SGLang for one request (pure)."""
        return to_sglang_params(sampling_params, self.eos_ids)

    def _pick(self) -> int:
        return min(range(len(self.engines)), key=lambda k: (self.in_flight[k], k))

    async def generate(
        self, prompt_ids: list[int], sampling_params: SamplingParams, images: list[Any] | None = None
    ) -> GenerationResult:
        if self.closed:
            raise RuntimeError("SGLangEngineGenerator.generate after close(): build a new generator")
        if not prompt_ids:
            raise ValueError("generate needs a non-empty prompt")
        if sampling_params.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {sampling_params.max_new_tokens}")
        if images:
            raise ValueError("SGLangEngineGenerator evaluates text agents; it got images")
        k = self._pick()
        self.in_flight[k] += 1
        try:
            result = await self.engines[k].async_generate(
                input_ids=list(prompt_ids),
                sampling_params=self.sglang_params(sampling_params),
                return_logprob=self.return_logprobs,
            )
        finally:
            self.in_flight[k] -= 1
        self.served[k] += 1
        return result_of_sglang(
            result, self.decode, sampling_params, self.eos_ids, return_logprobs=self.return_logprobs
        )

    def close(self) -> None:
        """Shut every engine down (their GPU subprocesses exit), even when one of them fails; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        _shutdown_all(self.engines)

    def __enter__(self) -> SGLangEngineGenerator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _shutdown_all(engines: list[Any]) -> None:
    """``shutdown()`` on every engine; the first failure is raised after all were tried."""
    errors = []
    for engine in engines:
        try:
            engine.shutdown()
        except Exception as exc:  # the others must still stop
            errors.append(exc)
    if errors:
        raise errors[0]
