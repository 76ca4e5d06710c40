"""A ``Generator`` (``protocol/generation.py``) on vLLM 0.32: token ids in; ids, text, sampled log-probs, finish
reason and matched stop string out, meaning exactly what ``generation/hf.py``'s replies mean (the requests, the
replies and the engine's options: ``generation/vllm_wire.py``).

- Engines (one API, ``AsyncLLM``'s subset used here): on GPUs vLLM's ``AsyncLLM`` (engine core in its own
  process, started with ``vllm_wire.engine_environment`` set); on CPU (``in_process``, the default without CUDA)
  ``InprocVLLMEngine``: vLLM's ``LLMEngine`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
  ``distributed_executor_backend="uni"``, eager), stepped in a worker thread; it starts in ~3 s where ``AsyncLLM``
  takes ~50 s on a 2-core CPU.
- Weights without restart (``load_weights``, the CPU route): pause (in-flight requests finish first; with
  ``keep``, partial rollout, they stop where they are and go on afterwards on the new weights), vLLM's
  layerwise in-place reload fed bucket by bucket through ``WeightLoadExtension`` (a ``worker_extension_cls``; the
  body of ``Worker.reload_weights`` split into begin / load / finish), prefix- and encoder-cache reset, the new
  weight version's label (vLLM stamps it on the tokens it samples: ``GenerationResult.weight_version``), resume. In
  process the tensors are handed over as they are; to a separate engine process as shared-memory handles
  (``sync/weight_sync.py``'s ``ForkingPickler`` blobs: ``collective_rpc`` turns tensors into lists).
- GPU routes: vLLM's own weight-transfer API on the ``AsyncLLM``, driven by the actor's vLLM trainer engine
  (``sync/vllm_transfer.py``) and answered by ``sync/vllm_engine_side.py:VLLMGpuSync``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from rlinf_ext.generation.sglang_wire import hf_eos_ids
from rlinf_ext.generation.vllm_wire import (
    VLLMEngineOptions,
    check_generate_args,
    engine_args,
    engine_environment,
    options_from_config,
    result_of_output,
    to_vllm_params,
)
from rlinf_ext.protocol.generation import GenerationResult, SamplingParams
from rlinf_ext.sync.weight_sync import open_handle, retry_shm_manager, serialize_handle

# the parts of an engine's start-up (``VLLMGenerator.start_parts``, seconds): the rollout worker logs them as
# ``time/rollout_start/<part>`` (``runner/trainer.py:part_metrics``)
START_TOKENIZER = "tokenizer"  # the HF tokenizer and EOS set
START_IMPORT = "import"  # importing vLLM's engine modules (the first import in the process pays it)
START_CONFIG = "config"  # EngineArgs -> VllmConfig (HF config, platform, scheduler settings)
START_ENGINE = "engine"  # the engine: worker, model load, KV cache allocation, warm-up


# ------------------------------------------------------------------------------------------------ engines
class InprocVLLMEngine:
    """vLLM's ``LLMEngine`` in this process behind the part of ``AsyncLLM``'s API the generator uses.

    One step loop task per event loop runs ``LLMEngine.step`` in a worker thread while requests are unfinished;
    every engine call holds ``_lock`` (the engine is not thread-safe). ``pause_generation(mode="wait")`` holds
    new requests back and returns once the running ones have finished; ``mode="keep"`` (partial rollout) is vLLM's
    own keep pause (``EngineCore.pause_scheduler``, as ``AsyncLLM`` does it): after the step in progress nothing is
    scheduled, and its cache reset preempts the running requests, which after the resume recompute their KV (prompt
    + tokens so far) on the weights loaded meanwhile and sample on from there; the step loop waits meanwhile.

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
        self._kept = False  # a keep pause: the requests in flight wait in vLLM's scheduler, nothing steps
        self._keeping: asyncio.Future | None = None  # the keep pause's call into vLLM (it waits for the engine's lock)

    @classmethod
    def from_engine_args(
        cls, kwargs: dict[str, Any], *, eager_helpers: bool = True, parts: dict[str, float] | None = None
    ) -> "InprocVLLMEngine":
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
            engine = LLMEngine(
                vllm_config=config,
                executor_class=Executor.get_class(config),
                log_stats=not kwargs.get("disable_log_stats", False),
            )
        _lap(parts, START_ENGINE, t)
        return cls(engine, eager_helpers=eager_helpers)

    async def generate(
        self, prompt: dict, sampling_params: Any, request_id: str, *, priority: int = 0
    ) -> AsyncIterator[Any]:
        while self._paused:  # polled: an asyncio.Event binds to the first event loop that waits on it
            await asyncio.sleep(0.005)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting[request_id] = future  # in flight from here on: a pause waits for it
        try:
            await asyncio.to_thread(
                self._locked, self.engine.add_request, request_id, prompt, sampling_params, priority=priority
            )
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
            if self._kept:  # vLLM's scheduler is paused and schedules nothing: no stepping until the resume
                await asyncio.sleep(0.005)
                continue
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

    async def pause_generation(self, *, mode: str = "wait", clear_cache: bool = True) -> None:
        if mode not in ("wait", "keep"):
            raise ValueError(f"InprocVLLMEngine pauses with mode='wait' or 'keep', got {mode!r}")
        self._paused = True
        if mode == "keep":  # the turns in flight stop after the step in progress (it holds the lock)
            self._kept = True
            self._keeping = asyncio.ensure_future(
                asyncio.to_thread(self._locked, self._core().pause_scheduler, "keep", clear_cache)
            )
            await asyncio.shield(self._keeping)  # a caller's timeout leaves the call to finish: resume waits for it
            return
        while self._waiting:  # requests already accepted finish on the current weights
            await asyncio.sleep(0.005)

    async def resume_generation(self) -> None:
        if self._kept:
            if self._keeping is not None:  # vLLM's pause lands first even when a timeout cut its wait short
                await asyncio.wait([self._keeping])
            await asyncio.to_thread(self._locked, self._core().resume_scheduler)
            self._kept, self._keeping = False, None
        self._paused = False

    def _core(self) -> Any:
        """vLLM's ``EngineCore`` behind the ``LLMEngine`` (its ``InprocClient``'s; ``LLMEngine`` reaches it so too)."""
        return self.engine.engine_core.engine_core

    async def is_paused(self) -> bool:
        return self._paused

    async def update_weight_version(self, new_version: str) -> None:
        """``AsyncLLM.update_weight_version``: the label vLLM puts on every token sampled from now on."""
        await asyncio.to_thread(self._locked, self.engine.set_weight_version, new_version)

    async def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ) -> list:
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
    os.environ.update(engine_environment(options))  # before the engine-core process starts: it inherits them
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

        opened = [(n, open_handle(t) if isinstance(t, (bytes, bytearray)) else t) for n, t in zip(names, tensors)]
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
    """``await gen.generate(prompt_ids, SamplingParams, seed=..., priority=...) -> GenerationResult``, safe from many
    coroutines (vLLM batches them continuously). ``seed`` None: ``base seed + call index`` when the generator has one.
    ``priority``: vLLM's (lower first), which only an engine started with ``scheduling_policy="priority"`` reads."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        eos_ids: Iterable[int],
        *,
        return_logprobs: bool = False,
        seed: int | None = None,
        in_process: bool = True,
    ):
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
    def start(
        cls, options: VLLMEngineOptions, *, return_logprobs: bool = False, seed: int | None = None
    ) -> "VLLMGenerator":
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

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: SamplingParams,
        images: list[Any] | None = None,
        *,
        seed: int | None = None,
        priority: int = 0,
    ) -> GenerationResult:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        check_generate_args(prompt_ids, sampling_params)
        if images:
            raise ValueError("VLLMGenerator is a text engine; it got images")
        call = next(self._calls)
        if seed is None and self._seed is not None:
            seed = self._seed + call
        params = VSamplingParams(
            **to_vllm_params(sampling_params, self.eos_ids, seed=seed, return_logprobs=self.return_logprobs),
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        final = None
        async for out in self.engine.generate(
            {"prompt_token_ids": [int(t) for t in prompt_ids]},
            params,
            f"rlinf-{next(self._ids)}",
            priority=int(priority),
        ):
            final = out
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output for a generate request")
        return result_of_output(final.outputs[0], self.decode, sampling_params, self.eos_ids, self.return_logprobs)

    async def prompt_logprobs(self, ids: list[int]) -> list[tuple[float | None, int, None]]:
        """vLLM's log-prob of every prompt token given the ones before (``prompt_logprobs=0``), as SGLang's
        ``input_token_logprobs`` entries ``(logprob, token_id, None)`` (the first ``None``): the post-sync probe
        (``sync/probe.py:probe_logprob_gap``)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = VSamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY
        )
        final = None
        async for out in self.engine.generate(
            {"prompt_token_ids": [int(t) for t in ids]}, params, f"rlinf-probe-{next(self._ids)}"
        ):
            final = out
        entries: list[tuple[float | None, int, None]] = [(None, int(ids[0]), None)]
        for tok, step in zip(ids[1:], final.prompt_logprobs[1:]):
            entries.append((float(step[int(tok)].logprob), int(tok), None))
        return entries

    # ---- weights (CPU route; the GPU routes are VLLMGpuSync's) ----
    async def begin_weight_load(self, *, keep: bool = False) -> None:
        """Pause (running requests finish, new ones wait; ``keep``, partial rollout: they stop where they are and
        go on after the resume on the new weights, each token labelled by the weights that sampled it), then open
        vLLM's layerwise reload; generation resumes if either fails or is cancelled (a caller's timeout cuts the
        pause short after it has begun)."""
        self._load_t0 = time.perf_counter()
        try:
            await self.engine.pause_generation(mode="keep" if keep else "wait")
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
                    tensor = retry_shm_manager(tensor.clone().share_memory_)
                tensors.append(serialize_handle(tensor))
        await self.engine.collective_rpc("rlinf_load_weights", args=(names, tensors))

    async def finish_weight_load(self, version: int | None = None) -> None:
        """Finish the layerwise reload, reset the prefix cache (cached KV of the old weights), label the weights
        ``version`` (None: keep the label: a load that broke off), resume."""
        try:
            await self.engine.collective_rpc("rlinf_finish_weight_load")
            # vLLM keys cached blocks by tokens, not weights; it refuses (False) while a request holds blocks
            if not await self.engine.reset_prefix_cache():
                raise RuntimeError(
                    "vLLM refused to reset its prefix cache after the weight load (a request still "
                    "holds KV blocks): the old weights' KV would serve new requests. The pause must "
                    "wait for every request (pause_generation(mode='wait'))."
                )
            await self.engine.reset_encoder_cache()  # vision embeddings of the old weights (VL models)
            if version is not None:
                await self.label_weights(version)
        finally:
            await self.engine.resume_generation()
        self.last_load_s = time.perf_counter() - self._load_t0

    async def label_weights(self, version: int) -> None:
        """vLLM's label of the weights it holds, stamped on every reply sampled from now on (``weight_version``);
        set only while paused (or before serving): vLLM labels the tokens of each engine step with the current one."""
        await self.engine.update_weight_version(str(int(version)))

    async def load_weights(self, named: Iterable[tuple[str, Any]], version: int | None = None) -> None:
        """All of a state dict (HF names) into the running engine, as one bucket."""
        await self.begin_weight_load()
        try:
            await self.load_weight_bucket(list(named))
        except BaseException:
            await self.finish_weight_load()
            raise
        await self.finish_weight_load(version)

    def shutdown(self) -> None:
        self.engine.shutdown()


__all__ = ["VLLMGenerator", "InprocVLLMEngine", "WeightLoadExtension", "start_engine", "refresh_tied_head"]
