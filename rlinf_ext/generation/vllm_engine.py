"""A ``Generator`` (``protocol/generation.py``) on vLLM 0.32: token ids in; ids, text, sampled log-probs, finish
reason and matched stop string out, meaning exactly what ``generation/hf.py``'s replies mean.

- Requests: ``{"prompt_token_ids": ...}`` (nothing is re-tokenised), stop strings checked by the engine
  (``include_stop_str_in_output``: the ids keep the stop string's tokens), ``stop_token_ids`` = the HF EOS set
  (``generation/hf.py:eos_token_ids``), a per-request ``seed``, ``logprobs=0`` (the sampled token's log-prob),
  ``output_kind=FINAL_ONLY``.
- Log-probs mean what the actor recomputes as the old log-probs (``training/logprobs.py``: log-softmax of
  logits / temperature) and what ``generation/hf.py`` returns: the engine runs with
  ``logprobs_mode="processed_logprobs"`` (vLLM's default ``raw_logprobs`` is taken before temperature scaling, so
  at temperature 0.7 it would differ from the actor's). vLLM's processed values also follow top-k / top-p /
  penalties; ``validate`` refuses ``rollout.return_logprobs`` with those on (``config/rules.py``).
- Replies: the turn's end is ``generation/turn_end.py``'s, told what vLLM decided (vLLM checks EOS and stop ids
  before the token budget, stop strings after it: a stop string completed by the last allowed token is
  classified ``stop`` as on every engine); the text is the HF tokenizer's decoding of the kept ids.
- Engines (one API, ``AsyncLLM``'s subset used here): on GPUs vLLM's ``AsyncLLM`` (engine core in its own
  process); on CPU (``in_process``, the default without CUDA) ``InprocVLLMEngine``: vLLM's ``LLMEngine``
  in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``, eager), stepped
  in a worker thread; it starts in ~3 s where ``AsyncLLM`` takes ~50 s on a 2-core CPU.
- Weights without restart (``load_weights``): pause (in-flight requests finish first), vLLM's layerwise in-place
  reload fed bucket by bucket through ``WeightLoadExtension`` (a ``worker_extension_cls``; the body of
  ``Worker.reload_weights`` split into begin / load / finish), prefix- and encoder-cache reset, resume. In process the
  tensors are handed over as they are; to a separate engine process as shared-memory handles
  (``sync/weight_sync.py``'s ``ForkingPickler`` blobs: ``collective_rpc`` turns tensors into lists).
- GPU routes (``VLLMGpuSync``, NOT GPU-verified, written against vllm 0.32.0's sources): the engine side of vLLM's
  weight-transfer API, driven by the actor's vLLM trainer engine (``sync/vllm_transfer.py``). Collocated =
  ``sleep(level=rollout.vllm.sleep_level)`` after rollout, ``wake_up(["weights"])``, the ``ipc`` backend's
  ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``, ``wake_up(["kv_cache"])``, prefix
  cache reset; disaggregated = the ``nccl`` backend (the actor's rank 0 joins the engines' NCCL group).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pickle
import threading
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from rlinf_ext.generation.sglang_wire import hf_eos_ids
from rlinf_ext.generation.turn_end import engine_finish, engine_sampling, turn_end
from rlinf_ext.models.dtypes import hf_name_of_precision
from rlinf_ext.protocol.generation import FinishReason, GenerationResult, SamplingParams
from rlinf_ext.sync.vllm_transfer import transfer_backend
from rlinf_ext.sync.weight_sync import serialize_handle

WORKER_EXTENSION = "rlinf_ext.generation.vllm_engine.WeightLoadExtension"
# the parts of an engine's start-up (``VLLMGenerator.start_parts``, seconds): the rollout worker logs them as
# ``time/rollout_start/<part>`` (``runner/trainer.py:part_metrics``)
START_TOKENIZER = "tokenizer"  # the HF tokenizer and EOS set
START_IMPORT = "import"  # importing vLLM's engine modules (the first import in the process pays it)
START_CONFIG = "config"  # EngineArgs -> VllmConfig (HF config, platform, scheduler settings)
START_ENGINE = "engine"  # the engine: worker, model load, KV cache allocation, warm-up
# the sampled token's log-prob after temperature scaling, as the actor computes it (vllm/config/model.py)
LOGPROBS_MODE = "processed_logprobs"


# ------------------------------------------------------------------------------------------------ options (pure)
@dataclass
class VLLMEngineOptions:
    """What starts one engine; ``engine_args`` turns it into ``AsyncEngineArgs``/``EngineArgs`` keywords."""

    model_path: str
    tokenizer_path: str | None = None
    dtype: str = "float32"  # Hugging Face spelling (float32, bfloat16, float16)
    seed: int = 0
    in_process: bool = True  # InprocVLLMEngine (CPU, CI); False = AsyncLLM (engine core in its own process)
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.65
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = "uni"
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_seqs: int = 128
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    kv_cache_memory_bytes: int | None = None  # CPU: vLLM reserves VLLM_CPU_KVCACHE_SPACE otherwise
    attention_backend: str | None = None  # None = vLLM's choice (CPU has one)
    enable_sleep_mode: bool = False  # GPU collocated route
    eager_helper_ops: bool = True  # in process: vLLM's torch.compile'd helper ops run eager (InprocVLLMEngine)
    weight_transfer_backend: Literal["ipc", "nccl"] | None = None  # GPU routes
    extra: dict[str, Any] = field(default_factory=dict)


def engine_args(options: VLLMEngineOptions) -> dict[str, Any]:
    """``EngineArgs`` keywords of ``options`` (pure)."""
    kwargs: dict[str, Any] = dict(
        model=str(options.model_path),
        tokenizer=str(options.tokenizer_path or options.model_path),
        dtype=options.dtype,
        seed=int(options.seed),
        enforce_eager=bool(options.enforce_eager),
        gpu_memory_utilization=float(options.gpu_memory_utilization),
        tensor_parallel_size=int(options.tensor_parallel_size),
        enable_prefix_caching=bool(options.enable_prefix_caching),
        enable_chunked_prefill=bool(options.enable_chunked_prefill),
        max_num_seqs=int(options.max_num_seqs),
        worker_extension_cls=WORKER_EXTENSION,
        disable_log_stats=True,
        logprobs_mode=LOGPROBS_MODE,
    )
    if options.distributed_executor_backend:
        kwargs["distributed_executor_backend"] = options.distributed_executor_backend
    for key in ("max_num_batched_tokens", "max_model_len", "kv_cache_memory_bytes", "attention_backend"):
        value = getattr(options, key)
        if value is not None:
            kwargs[key] = value
    if options.enable_sleep_mode:
        kwargs["enable_sleep_mode"] = True
    if options.weight_transfer_backend:
        kwargs["weight_transfer_config"] = {"backend": options.weight_transfer_backend}
    kwargs.update(options.extra)
    return kwargs


CPU_KV_CACHE_BYTES = 512 << 20
# CPU: no chunked prefill (vLLM 0.32's CPU model runner raises "CPU Generator does not use offset" when a seeded
# request is prefilled in parts), so a step's token budget must hold whole prompts: at least this, and the context
CPU_MIN_BATCHED_TOKENS = 8192


def cpu_batched_tokens(configured: int | None, seq_length: int) -> int:
    """The CPU engine's token budget per step without chunked prefill (pure): the configured budget, raised to a
    whole context and to ``CPU_MIN_BATCHED_TOKENS``."""
    return max(int(configured or 0), int(seq_length), CPU_MIN_BATCHED_TOKENS)


def options_from_config(cfg: Any, rank: int = 0, *, cuda: bool | None = None) -> VLLMEngineOptions:
    """The engine of ``cfg.rollout`` (``rollout.model``, ``rollout.*`` engine keys, ``rollout.vllm``).

    dtype = ``rollout.model.precision``; on CPU (``cuda`` False, the default without a CUDA device) the engine
    runs in process and eager with the ``uni`` executor, vLLM's CPU attention and ``rollout.vllm``'s
    ``kv_cache_memory_bytes``; on GPUs ``AsyncLLM`` with the config's executor, attention backend, CUDA graphs
    unless ``enforce_eager``, and the weight-transfer backend of the placement (``ipc`` collocated, with sleep
    mode; ``nccl`` disaggregated: ``sync/vllm_transfer.py:transfer_backend``)."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    rollout = cfg.rollout
    vcfg = rollout.vllm
    backend = transfer_backend(cfg, cuda)
    in_process = getattr(vcfg, "in_process", None)
    in_process = (not cuda) if in_process is None else bool(in_process)
    return VLLMEngineOptions(
        model_path=str(rollout.model.model_path),
        dtype=hf_name_of_precision(str(rollout.model.precision), "rollout.model.precision"),
        seed=int(cfg.runner.seed) + int(rank),
        in_process=in_process,
        enforce_eager=True if not cuda else bool(rollout.enforce_eager),
        gpu_memory_utilization=float(rollout.gpu_memory_utilization),
        tensor_parallel_size=int(rollout.tensor_parallel_size),
        distributed_executor_backend="uni" if (in_process or not cuda) else str(rollout.distributed_executor_backend),
        enable_prefix_caching=bool(vcfg.enable_prefix_caching),
        enable_chunked_prefill=bool(vcfg.enable_chunked_prefill) if cuda else False,
        max_num_seqs=int(rollout.max_running_requests),
        max_num_batched_tokens=vcfg.max_num_batched_tokens if cuda
        else cpu_batched_tokens(vcfg.max_num_batched_tokens, cfg.runner.seq_length),
        kv_cache_memory_bytes=(vcfg.kv_cache_memory_bytes or CPU_KV_CACHE_BYTES) if not cuda
        else vcfg.kv_cache_memory_bytes,
        max_model_len=int(cfg.runner.seq_length),
        attention_backend=str(vcfg.attention_backend) if cuda and vcfg.attention_backend else None,
        enable_sleep_mode=backend == "ipc",  # only a collocated engine sleeps (CuMem allocator)
        eager_helper_ops=not cuda,
        weight_transfer_backend=backend,
    )


# ------------------------------------------------------------------------------------------------ wire (pure)
def to_vllm_params(params: SamplingParams, eos_ids: Iterable[int], *, seed: int | None = None,
                   return_logprobs: bool = False) -> dict[str, Any]:
    """``vllm.SamplingParams`` keywords of one request (pure): ``turn_end.engine_sampling`` in vLLM's names;
    ``skip_special_tokens=False`` as the HF decode; stop strings always kept in the output (``turn_end`` cuts the
    text when the caller excludes them, as for HF)."""
    shared = engine_sampling(params, eos_ids)
    out: dict[str, Any] = dict(
        max_tokens=shared.max_new_tokens,
        temperature=shared.temperature,
        top_p=shared.top_p,
        top_k=shared.top_k,
        repetition_penalty=shared.repetition_penalty,
        stop=shared.stop,
        stop_token_ids=shared.stop_token_ids,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        ignore_eos=False,
        detokenize=bool(shared.stop),  # stop strings need the engine's incremental detokenizer
    )
    if seed is not None:
        out["seed"] = int(seed)
    if return_logprobs:
        out["logprobs"] = 0
    return out


def engine_reason(finish_reason: str | None, stop_reason: int | str | None) -> tuple[FinishReason, str | None]:
    """vLLM's ``finish_reason``/``stop_reason`` -> ``turn_end``'s ``engine_reason``/``engine_stop`` (pure; the
    shared reading, ``turn_end.engine_finish``): ``stop`` with a string = a stop string, ``stop`` with an id or
    None = EOS, ``length`` = the budget."""
    return engine_finish(finish_reason, stop_reason, "vLLM")


def result_of_output(output: Any, decode, params: SamplingParams, eos_ids: Iterable[int],
                     return_logprobs: bool = False) -> GenerationResult:
    """One ``vllm.CompletionOutput`` -> ``GenerationResult`` (pure but for ``decode``)."""
    ids = [int(t) for t in output.token_ids]
    reason, stop = engine_reason(output.finish_reason, output.stop_reason)
    end = turn_end(ids, decode, eos_ids=set(eos_ids), stop=params.stop, max_new_tokens=params.max_new_tokens,
                   include_stop_str_in_output=params.include_stop_str_in_output, engine_reason=reason,
                   engine_stop=stop)
    logprobs = None
    if return_logprobs and output.logprobs is not None:
        logprobs = [float(step[tok].logprob) for tok, step in zip(ids, output.logprobs)][: len(end.output_ids)]
    return GenerationResult(output_ids=end.output_ids, text=end.text, finish_reason=end.finish_reason,
                            matched_stop=end.matched_stop, logprobs=logprobs)


# ------------------------------------------------------------------------------------------------ engines
def check_generate_args(prompt_ids: list[int], sampling_params: SamplingParams) -> None:
    """What every vLLM generate call refuses before it reaches the engine."""
    if not prompt_ids:
        raise ValueError("generate needs a non-empty prompt")
    if sampling_params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {sampling_params.max_new_tokens}")


class InprocVLLMEngine:
    """vLLM's ``LLMEngine`` in this process behind the part of ``AsyncLLM``'s API the generator uses.

    One step loop task per event loop runs ``LLMEngine.step`` in a worker thread while requests are unfinished;
    every engine call holds ``_lock`` (the engine is not thread-safe). ``pause_generation(mode="wait")`` holds
    new requests back and returns once the running ones have finished.

    ``eager_helpers``: every engine call runs under ``torch.compiler.set_stance("force_eager")``. The model
    itself is eager already (``enforce_eager``), but vLLM ``torch.compile``s small helper ops with inductor
    (the log-prob ranks, ``vllm/v1/sample/ops/logprobs.py``; top-k/top-p): on a 2-core CPU the first log-prob
    request then waits for a C++ build (measured 10.8 s with a cold inductor cache, 2.4 s warm, against 0.08 s
    eager) and a new batch shape can recompile, for kernels that save nothing at these sizes."""

    def __init__(self, engine: Any, *, eager_helpers: bool = True):
        self.engine = engine
        self.eager_helpers = eager_helpers
        self._lock = threading.Lock()
        self._waiting: dict[str, asyncio.Future] = {}
        self._stepper: asyncio.Task | None = None
        self._paused = False
        self._resumed: asyncio.Event | None = None

    @classmethod
    def from_engine_args(cls, kwargs: dict[str, Any], *, eager_helpers: bool = True,
                         parts: dict[str, float] | None = None) -> "InprocVLLMEngine":
        """vLLM's ``LLMEngine.from_engine_args`` in its two steps, timed into ``parts`` (``START_*`` keys):
        the import, the engine config, the engine (model load, KV cache, warm-up)."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the engine is built: InprocClient
        parts = {} if parts is None else parts
        t = time.perf_counter()
        from vllm import EngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.llm_engine import LLMEngine
        from vllm.v1.executor import Executor

        t = _lap(parts, START_IMPORT, t)
        config = EngineArgs(**kwargs).create_engine_config(UsageContext.ENGINE_CONTEXT)
        t = _lap(parts, START_CONFIG, t)
        with _stance(eager_helpers):
            engine = LLMEngine(vllm_config=config, executor_class=Executor.get_class(config),
                               log_stats=not kwargs.get("disable_log_stats", False))
        _lap(parts, START_ENGINE, t)
        return cls(engine, eager_helpers=eager_helpers)

    async def generate(self, prompt: dict, sampling_params: Any, request_id: str) -> AsyncIterator[Any]:
        while self._paused:
            await self._resume_event().wait()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting[request_id] = future  # in flight from here on: a pause waits for it
        try:
            await asyncio.to_thread(self._locked, self.engine.add_request, request_id, prompt, sampling_params)
            if self._stepper is None or self._stepper.done():
                self._stepper = loop.create_task(self._step_loop())
            yield await future
        except BaseException:
            if self._waiting.pop(request_id, None) is not None:
                await asyncio.to_thread(self._locked, self.engine.abort_request, [request_id])
            raise

    def _locked(self, fn, *args, **kwargs):
        with self._lock, _stance(self.eager_helpers):
            return fn(*args, **kwargs)

    async def _step_loop(self) -> None:
        while self._waiting:
            try:
                outputs = await asyncio.to_thread(self._locked, self.engine.step)
            except Exception as exc:  # every waiting caller gets the error instead of hanging
                for future in self._waiting.values():
                    if not future.done():
                        future.set_exception(exc)
                self._waiting.clear()
                return
            for out in outputs:
                if out.finished and out.request_id in self._waiting:
                    future = self._waiting.pop(out.request_id)
                    if not future.done():
                        future.set_result(out)

    def _resume_event(self) -> asyncio.Event:
        if self._resumed is None:
            self._resumed = asyncio.Event()
        return self._resumed

    async def pause_generation(self, *, mode: str = "wait", clear_cache: bool = True) -> None:
        if mode != "wait":
            raise ValueError(f"InprocVLLMEngine pauses with mode='wait' only, got {mode!r}")
        self._paused = True
        self._resume_event().clear()
        while self._waiting:  # requests already accepted finish on the current weights
            await asyncio.sleep(0.005)

    async def resume_generation(self) -> None:
        self._paused = False
        self._resume_event().set()

    async def is_paused(self) -> bool:
        return self._paused

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                             kwargs: dict | None = None) -> list:
        return await asyncio.to_thread(self._locked, self.engine.collective_rpc, method, timeout, args, kwargs)

    async def reset_prefix_cache(self, *args: Any) -> bool:
        return await asyncio.to_thread(self._locked, self.engine.reset_prefix_cache, *args)

    async def reset_encoder_cache(self) -> None:
        await asyncio.to_thread(self._locked, self.engine.reset_encoder_cache)

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        await asyncio.to_thread(self._locked, self.engine.sleep, level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await asyncio.to_thread(self._locked, self.engine.wake_up, tags)

    def shutdown(self) -> None:
        core = getattr(self.engine, "engine_core", None)
        if core is not None:
            core.shutdown()


def start_engine(options: VLLMEngineOptions, parts: dict[str, float] | None = None) -> Any:
    """``InprocVLLMEngine`` or vLLM's ``AsyncLLM`` (``options.in_process``); the start-up's parts (seconds) go into
    ``parts`` (``START_IMPORT``, and ``START_CONFIG`` + ``START_ENGINE`` in process, else ``START_ENGINE``)."""
    kwargs = engine_args(options)
    if options.in_process:
        return InprocVLLMEngine.from_engine_args(kwargs, eager_helpers=options.eager_helper_ops, parts=parts)
    parts = {} if parts is None else parts
    t = time.perf_counter()
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    t = _lap(parts, START_IMPORT, t)
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    _lap(parts, START_ENGINE, t)
    return engine


def _lap(parts: dict[str, float], key: str, since: float) -> float:
    now = time.perf_counter()
    parts[key] = parts.get(key, 0.0) + (now - since)
    return now


def _stance(eager: bool):
    """``torch.compiler.set_stance("force_eager")`` (a context manager) or nothing."""
    if not eager:
        return contextlib.nullcontext()
    import torch

    return torch.compiler.set_stance("force_eager")


# ------------------------------------------------------------------------------------------------ worker side
def refresh_tied_head(model: Any) -> bool:
    """Re-run the output head's weight processing when it shares the input embedding's tensor (tied embeddings).

    The sync sends no ``lm_head.weight`` for a tied model, so vLLM's layerwise reload loads nothing into the head's
    layer and skips its processing; on CPU that processing prepacks the weight for the GEMM (``cpu_linear``), and
    the head kept computing logits with the old embedding (measured: 0.03 nats mean log-prob gap after one change
    of the embedding). True when the head was refreshed."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    weight = getattr(head, "weight", None)
    if head is None or embed is None or head is embed or weight is None or weight.is_meta:
        return False
    if weight.data_ptr() != embed.weight.data_ptr() or not hasattr(head, "quant_method"):
        return False
    head.quant_method.process_weights_after_loading(head)
    return True


class WeightLoadExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``): ``Worker.reload_weights``'s body (vLLM's layerwise
    in-place reload, ``vllm/model_executor/model_loader/reload/inplace.py``) split in three, so the weights can arrive
    bucket by bucket. Tensors come as they are (in process) or as ``ForkingPickler`` handle blobs (bytes) from
    another process (``sync/weight_sync.py:serialize_handle``)."""

    def rlinf_begin_weight_load(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())

    def rlinf_load_weights(self, names: list[str], tensors: list) -> int:
        from vllm.config import set_current_vllm_config

        opened = [(n, pickle.loads(t) if isinstance(t, (bytes, bytearray)) else t) for n, t in zip(names, tensors)]
        with set_current_vllm_config(self.vllm_config):
            loaded = self.model_runner.get_model().load_weights(iter(opened))
        return len(loaded or ())

    def rlinf_finish_weight_load(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        runner = self.model_runner
        model = runner.get_model()
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(model, self.vllm_config.model_config)
            refresh_tied_head(model)
        # the encoder cache is reset from the engine (``reset_encoder_cache``): the scheduler tracks it too, and a
        # worker-only reset leaves it expecting vision embeddings that are gone ("Encoder cache miss")
        for reset in ("reset_lora_state", "reset_mm_cache"):
            if hasattr(runner, reset):
                getattr(runner, reset)()


# ------------------------------------------------------------------------------------------------ generator
class VLLMGenerator:
    """``await gen.generate(prompt_ids, SamplingParams, seed=...) -> GenerationResult``, safe from many coroutines
    (vLLM batches them continuously). ``seed`` None: ``base seed + call index`` when the generator has one."""

    def __init__(self, engine: Any, tokenizer: Any, eos_ids: Iterable[int], *, return_logprobs: bool = False,
                 seed: int | None = None, in_process: bool = True):
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_ids = set(int(i) for i in eos_ids)
        self.return_logprobs = return_logprobs
        self.in_process = in_process
        self._seed = seed
        self._calls = itertools.count()
        self._ids = itertools.count()
        self.last_load_s: float | None = None
        self.start_s: float | None = None
        self.start_parts: dict[str, float] = {}

    @classmethod
    def start(cls, options: VLLMEngineOptions, *, return_logprobs: bool = False,
              seed: int | None = None) -> "VLLMGenerator":
        from transformers import AutoTokenizer

        parts: dict[str, float] = {}
        t = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(str(options.tokenizer_path or options.model_path))
        eos = hf_eos_ids(str(options.model_path), tokenizer)
        t0 = _lap(parts, START_TOKENIZER, t)
        engine = start_engine(options, parts)
        gen = cls(engine, tokenizer, eos, return_logprobs=return_logprobs, seed=seed, in_process=options.in_process)
        gen.start_s = time.perf_counter() - t0
        gen.start_parts = parts
        return gen

    @classmethod
    def from_config(cls, cfg: Any, rank: int = 0, **kwargs: Any) -> "VLLMGenerator":
        return cls.start(options_from_config(cfg, rank), return_logprobs=bool(cfg.rollout.return_logprobs), **kwargs)

    def reseed(self, seed: int | None) -> None:
        self._seed, self._calls = seed, itertools.count()

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams,
                       images: list[Any] | None = None, *, seed: int | None = None) -> GenerationResult:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        check_generate_args(prompt_ids, sampling_params)
        if images:
            raise ValueError("VLLMGenerator is a text engine; it got images")
        call = next(self._calls)
        if seed is None and self._seed is not None:
            seed = self._seed + call
        params = VSamplingParams(**to_vllm_params(sampling_params, self.eos_ids, seed=seed,
                                                  return_logprobs=self.return_logprobs),
                                 output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in self.engine.generate({"prompt_token_ids": [int(t) for t in prompt_ids]}, params,
                                              f"rlinf-{next(self._ids)}"):
            final = out
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output for a generate request")
        return result_of_output(final.outputs[0], self.decode, sampling_params, self.eos_ids, self.return_logprobs)

    async def prompt_logprobs(self, ids: list[int]) -> list[tuple[float | None, int, None]]:
        """vLLM's log-prob of every prompt token given the ones before (``prompt_logprobs=0``), as SGLang's
        ``input_token_logprobs`` entries ``(logprob, token_id, None)`` (the first ``None``): the post-sync probe
        (``workers/rollout_sglang.py:probe_logprob_gap``)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = VSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False,
                                 output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in self.engine.generate({"prompt_token_ids": [int(t) for t in ids]}, params,
                                              f"rlinf-probe-{next(self._ids)}"):
            final = out
        entries: list[tuple[float | None, int, None]] = [(None, int(ids[0]), None)]
        for tok, step in zip(ids[1:], final.prompt_logprobs[1:]):
            entries.append((float(step[int(tok)].logprob), int(tok), None))
        return entries

    # ---- weights (CPU route; the GPU routes are VLLMGpuSync's) ----
    async def begin_weight_load(self) -> None:
        """Pause (running requests finish, new ones wait), then open vLLM's layerwise reload."""
        self._load_t0 = time.perf_counter()
        await self.engine.pause_generation(mode="wait")
        try:
            await self.engine.collective_rpc("rlinf_begin_weight_load")
        except BaseException:
            await self.engine.resume_generation()
            raise

    async def load_weight_bucket(self, named: Iterable[tuple[str, Any]]) -> None:
        """One bucket of ``(HF name, tensor)`` pairs into the paused engine: the tensors themselves in process,
        shared-memory handles to a separate engine process."""
        names, tensors = [], []
        for name, tensor in named:
            names.append(name)
            if self.in_process:
                tensors.append(tensor)
            else:
                if tensor.device.type == "cpu" and not tensor.is_shared():
                    tensor = tensor.clone().share_memory_()
                tensors.append(serialize_handle(tensor))
        await self.engine.collective_rpc("rlinf_load_weights", args=(names, tensors))

    async def finish_weight_load(self) -> None:
        """Finish the layerwise reload, reset the prefix cache (cached KV of the old weights), resume."""
        try:
            await self.engine.collective_rpc("rlinf_finish_weight_load")
            await self.engine.reset_prefix_cache()
            await self.engine.reset_encoder_cache()  # vision embeddings of the old weights (VL models)
        finally:
            await self.engine.resume_generation()
        self.last_load_s = time.perf_counter() - self._load_t0

    async def load_weights(self, named: Iterable[tuple[str, Any]]) -> None:
        """All of a state dict (HF names) into the running engine, as one bucket."""
        await self.begin_weight_load()
        try:
            await self.load_weight_bucket(list(named))
        except BaseException:
            await self.finish_weight_load()
            raise
        await self.finish_weight_load()

    def shutdown(self) -> None:
        self.engine.shutdown()


# ------------------------------------------------------------------------------------------------ GPU routes
class VLLMGpuSync:
    """The engine side of vLLM's weight-transfer API on an ``AsyncLLM`` (NOT GPU-verified; call order tested with
    recording engines): answers the trainer's control calls (``sync/engine_calls.py:EngineCall``) in order.

    collocated (``ipc``): ``after_rollout`` -> ``sleep(level, mode="wait")`` (requests in flight finish first,
    vLLM #28714; weights and KV cache leave the GPU for training); ``init_weight_transfer_engine`` once;
    ``start_weight_update`` -> ``wake_up(["weights"])`` + start; ``update_weights`` -> the trainer's CUDA IPC
    handles; ``finish_weight_update`` -> finish + ``wake_up(["kv_cache"])`` + ``reset_prefix_cache``.
    disaggregated (``nccl``): never sleeps; start pauses generation (``mode="wait"``), each ``update_weights``
    receives the trainer's broadcast, finish resets the prefix cache and resumes."""

    def __init__(self, engine: Any, backend: Literal["ipc", "nccl"], *, sleep_level: int = 2):
        self.engine, self.backend, self.sleep_level = engine, backend, int(sleep_level)
        self.sleeping = False
        self.updating = False

    async def after_rollout(self) -> None:
        if self.backend == "ipc" and not self.sleeping:
            await self.engine.sleep(level=self.sleep_level, mode="wait")
            self.sleeping = True

    async def handle(self, call: Any) -> None:
        """One ``EngineCall`` (method + payload) from the trainer."""
        from vllm.distributed.weight_transfer.base import (  # lazy: vllm is slow to import
            WeightTransferInitRequest,
            WeightTransferUpdateRequest,
        )

        if call.method == "init_weight_transfer_engine":
            await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=dict(call.payload)))
        elif call.method == "start_weight_update":
            await self.begin()
        elif call.method == "update_weights":
            if not self.updating:
                raise RuntimeError("update_weights before start_weight_update")
            await self.engine.update_weights(WeightTransferUpdateRequest(update_info=call.payload))
        elif call.method == "finish_weight_update":
            await self.finish(call.payload)
        else:
            raise ValueError(f"unknown weight-transfer call {call.method!r}")

    async def begin(self) -> None:
        if self.sleeping:
            await self.engine.wake_up(tags=["weights"])
        else:
            await self.engine.pause_generation(mode="wait")
        self.updating = True
        await self.engine.start_weight_update()

    async def finish(self, version: str | None = None) -> None:
        """Always leaves the engine serving (also after a failed transfer: the probe then refuses the weights)."""
        try:
            if self.updating:
                await self.engine.finish_weight_update(version)
        finally:
            self.updating = False
            if self.sleeping:
                await self.engine.wake_up(tags=["kv_cache"])
                self.sleeping = False
            await self.engine.reset_prefix_cache()  # vLLM #46125: not reset automatically after an update
            await self.engine.reset_encoder_cache()  # vision embeddings of the old weights (VL models)
            await self.engine.resume_generation()


__all__ = ["VLLMEngineOptions", "VLLMGenerator", "InprocVLLMEngine", "VLLMGpuSync", "WeightLoadExtension",
           "engine_args", "options_from_config", "to_vllm_params", "engine_reason", "result_of_output"]
