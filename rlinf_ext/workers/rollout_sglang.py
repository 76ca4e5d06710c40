"""SGLang rollout worker on sglang 0.5.23's own ``Engine`` (written against its sources, NOT GPU-verified).

Same serving loop, replies and receive side as ``workers/rollout_hf.py``. One engine per TP group, started with
``load_format="dummy"`` (the first sync overwrites every weight). ``SGLangControl`` makes 0.5.23's
``TokenizerManager`` calls (tested on CPU against a recording engine checked with sglang's signatures): collocated,
``release_memory_occupation`` after the rollout (SGLang asserts an idle scheduler); per sync, weights resumed,
``begin_weight_update``, the buckets (collocated: each TP rank's handles re-pickled unopened, ``reduction_of``;
disaggregated: ``sync/sglang_transfer.py``), ``end_weight_update``, KV resumed, ``flush_cache`` (retried while a
request is held, ``FLUSH_ATTEMPTS``), then the gate reopens and the probe runs. The gate is ``WeightGate``, not
SGLang's ``pause_generation``, so the CPU lane tests it; every wait is bounded by ``SYNC_TIMEOUT_S``."""

from __future__ import annotations

import functools
import io
import pickle
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from rlinf.scheduler import Worker

from rlinf_ext.config.placement import is_collocated
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.generation.sglang_engine import load_engine_class, server_kwargs
from rlinf_ext.generation.sglang_vl import (
    disallowed_tokens_processor,
    mm_request,
    retokenize_mismatch,
    vl_server_overrides,
)
from rlinf_ext.generation.sglang_wire import INPUT_TOKEN_LOGPROBS, hf_eos_ids, result_of_sglang, to_sglang_params
from rlinf_ext.models.qwen2 import load_hf_config_dict
from rlinf_ext.protocol.generation import (
    GenerateReply,
    GenerateRequest,
    SamplingParams,
    reply_of,
    sampling_params_from_request,
)
from rlinf_ext.protocol.metric_keys import RETOKENIZE_COUNTS, RETOKENIZE_MISMATCH
from rlinf_ext.protocol.vl_tokens import IMAGE_PAD, VISION_END, VISION_START, banned_token_ids, text_vocab_size
from rlinf_ext.sync.engine_calls import SYNC_TIMEOUT_S, EngineCall, serve_engine_calls, wait_async
from rlinf_ext.sync.probe import probe_atol, probe_logprob_gap
from rlinf_ext.sync.sglang_transfer import INIT_GROUP, SGLANG_CALLS, UPDATE_DISTRIBUTED, uses_sglang_distributed
from rlinf_ext.sync.weight_sync import HandleBucket, SyncRoutes, WeightSyncError, receive_weights
from rlinf_ext.workers.rollout_serving import WeightGate, next_weight_version, serve_requests

# sglang 0.5.23's memory tags (sglang/srt/constants.py): weights come back first (the update writes them), the
# KV cache and the CUDA graphs after the update
WEIGHTS_TAGS = ["weights"]
CACHE_TAGS = ["kv_cache", "cuda_graph"]
# flush_cache after an update: sglang 0.5.23 refuses it while its scheduler holds a request (with overlap scheduling
# it may still hold the last batch just after the requests finished). Given a timeout, the scheduler defers the
# flush until it is idle, up to that long (sglang/srt/managers/scheduler_components/flush_wrapper.py); a refusal
# is retried.
FLUSH_IDLE_WAIT_S = 30.0
FLUSH_ATTEMPTS = 3


# ------------------------------------------------------------------------------------------------ payloads (pure)
class _Reduced:
    """A pickled reduction ``fn(*args)`` kept as it is: pickling it again writes the same ``fn`` and ``args``."""

    def __init__(self, fn: Callable, *args: Any):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


# where torch's tensor/storage rebuild functions live (and SGLang's patch of the CUDA one, which names the GPU by UUID)
_REBUILD_MODULES = ("torch.multiprocessing.reductions", "sglang.srt.utils.patch_torch")


class _ReductionReader(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        found = super().find_class(module, name)
        return functools.partial(_Reduced, found) if module in _REBUILD_MODULES else found


def reduction_of(blob: bytes) -> _Reduced:
    """A tensor handle (``sync/weight_sync.py:serialize_handle``, a ``ForkingPickler`` dump) read back WITHOUT
    rebuilding the tensor: no CUDA IPC handle is opened in this process; pickling the result again gives the
    same handle (pure)."""
    reduced = _ReductionReader(io.BytesIO(blob)).load()
    if not isinstance(reduced, _Reduced):
        raise WeightSyncError(f"a weight handle rebuilt as {type(reduced).__name__}, not through torch's reductions")
    return reduced


def rank_payloads(messages: list, tp: int, serialize: Callable[[Any], bytes]) -> list[bytes]:
    """SGLang's ``serialized_named_tensors`` for one bucket of the collocated route: one payload per TP rank of the
    engine, each a serialized ``[(HF name, tensor on that rank's GPU), ...]`` (sglang 0.5.23:
    ``TpModelWorker.deserialize_own_rank`` opens entry ``tp_rank`` only) made of the handle bucket of that TP slot
    (from the actor rank on its GPU), re-pickled unopened. Pure but for ``serialize``."""
    if not messages or not all(isinstance(m, HandleBucket) for m in messages):
        raise WeightSyncError(
            f"expected one handle bucket per TP slot (the collocated route), got {[type(m).__name__ for m in messages]}"
        )
    if len(messages) != tp:
        raise WeightSyncError(f"{len(messages)} handle bucket(s) for an engine of TP size {tp}")
    names = messages[0].names
    if any(m.names != names for m in messages):
        raise WeightSyncError("the TP slots of one engine received different buckets")
    return [serialize([(n, reduction_of(h)) for n, h in zip(m.names, m.handles)]) for m in messages]


# ------------------------------------------------------------------------------------------------ the engine
class SGLangControl:
    """The calls this worker makes into one sglang 0.5.23 ``Engine`` (its ``TokenizerManager``'s async methods:
    the ``Engine``'s own wrappers run their own event loop, which an async worker cannot). NOT GPU-verified; on CPU
    the tests run this class over a recording engine whose every call is checked against sglang 0.5.23's
    signatures, with its request types read from sglang's source (``io_struct`` and ``serializer``: sglang's
    ``io_struct`` module and ``MultiprocessingSerializer`` by default)."""

    def __init__(self, engine: Any, io_struct: Any = None, serializer: Any = None):
        if io_struct is None:
            from sglang.srt.managers import io_struct  # lazy: the SGLang profile only (importing it initialises CUDA)
        if serializer is None:
            from sglang.srt.utils import MultiprocessingSerializer as serializer  # lazy: as above

        self.engine, self.io, self.serializer = engine, io_struct, serializer
        self.manager = engine.tokenizer_manager

    async def generate(self, **request: Any) -> dict:
        return await self.engine.async_generate(**request)

    async def release(self) -> None:
        await self.manager.release_memory_occupation(self.io.ReleaseMemoryOccupationReqInput(tags=None), None)

    async def resume(self, tags: list[str]) -> None:
        await self.manager.resume_memory_occupation(self.io.ResumeMemoryOccupationReqInput(tags=list(tags)), None)

    async def begin_update(self) -> None:
        _check(await self.manager.begin_weight_update(self.io.BeginWeightUpdateReqInput(), None), "begin_weight_update")

    async def update(self, payloads: list[bytes]) -> None:
        request = self.io.UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=payloads, load_format=None, flush_cache=False
        )
        _check(await self.manager.update_weights_from_tensor(request, None), "update_weights_from_tensor")

    async def init_group(self, info: dict) -> None:
        _check(
            await self.manager.init_weights_update_group(self.io.InitWeightsUpdateGroupReqInput(**info), None),
            "init_weights_update_group",
        )

    async def update_distributed(self, request: dict) -> None:
        _check(
            await self.manager.update_weights_from_distributed(
                self.io.UpdateWeightsFromDistributedReqInput(**request), None
            ),
            "update_weights_from_distributed",
        )

    async def end_update(self) -> None:
        _check(await self.manager.end_weight_update(self.io.EndWeightUpdateReqInput(), None), "end_weight_update")

    async def flush(self, idle_wait_s: float) -> tuple[bool, str]:
        """``flush_cache``, deferred by SGLang until its scheduler is idle for up to ``idle_wait_s``: (success,
        SGLang's message)."""
        reply = await self.manager.flush_cache(timeout_s=idle_wait_s)
        return bool(reply.success), str(reply.message)

    def serialize(self, named: Any) -> bytes:
        return self.serializer.serialize(named)

    def shutdown(self) -> None:
        self.engine.shutdown()


def _check(reply: tuple[bool, str], what: str) -> None:
    ok, message = reply
    if not ok:
        raise WeightSyncError(f"SGLang's {what} failed: {message}")


# ------------------------------------------------------------------------------------------------ the worker
class SGLangRolloutState:
    """The worker's logic without RLinf's ``Worker`` (tests drive it with ``SGLangControl`` over a recording engine,
    and fake channels)."""

    def _setup(
        self,
        cfg: ExperimentConfig,
        verify_sync: bool = True,
        sync_atol: float | None = None,
        collocated: bool | None = None,
        distributed: bool | None = None,
    ) -> None:
        """``sync_atol`` None: the probe's tolerance for the engine's precision (``sync/probe.py:probe_atol``)."""
        self.cfg = cfg
        self.verify_sync = verify_sync
        self.sync_atol = probe_atol(str(cfg.rollout.model.precision)) if sync_atol is None else float(sync_atol)
        self.collocated = is_collocated(cfg) if collocated is None else collocated
        # disaggregated on GPUs: SGLang's own weight-update group (sync/sglang_transfer.py)
        self.distributed = uses_sglang_distributed(cfg, cuda=True) if distributed is None else distributed
        self.tp = int(cfg.rollout.tensor_parallel_size)
        # batches rolled out ahead: the engine schedules by priority (server_kwargs), each request its batch's index
        self.by_priority = int(cfg.runner.max_staleness) > 0
        self.control: Any = None
        self.decode: Callable[[list[int]], str] = lambda ids: ""
        self.eos_ids: list[int] = []
        self.defaults = SamplingParams()
        self.vl: tuple | None = None  # (vision token ids, banned ids, serialised logit processor)
        self.released = False
        self.gate = WeightGate()  # the requests in flight, and the weight version that generates them
        self.sync_timeout_s = SYNC_TIMEOUT_S  # the longest a sync waits for the requests in flight, or for one call
        self.sync_routes: SyncRoutes | None = None
        self.last_sync_logprob_gap: float | None = None
        self.last_sync: dict | None = None
        self.requests_served = 0
        self.retokenize_mismatches = 0.0  # rollout/retokenize_mismatch: requests SGLang re-tokenised differently

    def _attach(
        self,
        control: Any,
        decode: Callable[[list[int]], str],
        eos_ids: list[int],
        defaults: SamplingParams,
        vl: tuple | None = None,
    ) -> None:
        self.control, self.decode, self.eos_ids, self.defaults, self.vl = control, decode, list(eos_ids), defaults, vl

    @property
    def weight_version(self) -> int:
        return self.gate.version

    @property
    def in_flight(self) -> int:
        return self.gate.in_flight

    @property
    def return_logprobs(self) -> bool:
        return bool(self.cfg.rollout.return_logprobs)

    # ---- generation
    async def _generate(self, request: GenerateRequest) -> GenerateReply:
        if self.released:
            raise RuntimeError(
                "a generate request reached the SGLang engine while its memory is released "
                "(between offload_engine and the next weight sync)"
            )
        params = sampling_params_from_request(self.defaults, request.get("sampling_params"))
        body: dict[str, Any] = {
            "input_ids": [int(t) for t in request["prompt_ids"]],
            "sampling_params": to_sglang_params(params, self.eos_ids),
        }
        images = request.get("images")
        if images:  # vision-language: every image of the context, the banned ids (generation/sglang_vl.py)
            if self.vl is None:
                raise ValueError("images sent to a text SGLang engine (rollout.model.model_type is not qwen2.5_vl)")
            token_ids, banned, processor = self.vl
            body = mm_request(
                body["input_ids"],
                images,
                body["sampling_params"],
                token_ids=token_ids,
                banned_ids=banned,
                logit_processor=processor,
            )
        if self.by_priority:  # lower first (schedule_low_priority_values_first); SGLang may abort it when disabled
            body["priority"] = int(request.get("priority", 0))
        async with self.gate.turn(request["channel_key"]) as version:
            result = await self.control.generate(**body, return_logprob=self.return_logprobs)
        if images:
            self.retokenize_mismatches += retokenize_mismatch(body["input_ids"], result.get("meta_info") or {})
        self.requests_served += 1
        return reply_of(
            replace(
                result_of_sglang(result, self.decode, params, self.eos_ids, return_logprobs=self.return_logprobs),
                weight_version=version,
            )
        )

    async def rollout_serverless(self, input_channel, output_channel) -> None:
        """Serve generate requests until a ``STOP_SERVING`` request arrives."""
        await serve_requests(input_channel, output_channel, self._generate)

    # ---- memory (collocated only)
    async def _release(self) -> None:
        if not self.collocated or self.released:
            return
        if self.in_flight:
            raise RuntimeError(
                f"offload_engine with {self.in_flight} generate request(s) in flight: SGLang releases "
                "its memory only when idle (the rollout must finish before the engine is offloaded)"
            )
        await self.control.release()
        self.released = True

    # ---- weight sync (rollout side)
    async def set_weight_sync(self, routes: SyncRoutes) -> None:
        self.sync_routes = routes

    @property
    def engine_name(self) -> str:
        return f"SGLang rollout rank {self._rank}"

    async def _receive_distributed(self, target: int) -> None:
        """The actor drives the transfer (``sync/sglang_transfer.py``): its calls are answered in order; the update
        session opens at the first bucket (once the requests in flight have finished) and closes whatever happened."""
        control, begun, loaded = self.control, False, False

        async def handle(call: EngineCall) -> None:
            nonlocal begun
            if call.method == INIT_GROUP:
                await control.init_group(call.payload)
            elif call.method == UPDATE_DISTRIBUTED:
                if not begun:
                    await self.gate.pause(self.engine_name, self.sync_timeout_s)
                    await control.begin_update()
                    begun = True
                await control.update_distributed(call.payload)

        try:
            header = await serve_engine_calls(
                self, handle, actor_group=self.cfg.actor.group_name, methods=SGLANG_CALLS, timeout_s=self.sync_timeout_s
            )
            loaded = True
        finally:
            if self.gate.paused:  # the update began, or its pause timed out
                await self._reopen(begun, loaded, target)
        await self._after_load(header, {"sources": [header.sender], "mode": "sglang_distributed"})

    async def _reopen(self, begun: bool, loaded: bool, target: int) -> None:
        """The end of a sync, whatever happened: the update session closed, the engine's cache given back
        (collocated), the prefix cache flushed after a complete load (before any new request can reach the
        scheduler), then the gate reopened on the new version (the old one when the load broke off)."""
        try:
            if begun:
                await self.control.end_update()
                if self.released:
                    await self.control.resume(CACHE_TAGS)
                    self.released = False
                if loaded:
                    await self._flush()
        finally:
            self.gate.resume(target if loaded else None)

    async def _flush(self) -> None:
        refusals = []
        for _ in range(FLUSH_ATTEMPTS):
            ok, message = await wait_async(
                self.control.flush(FLUSH_IDLE_WAIT_S), self.sync_timeout_s, f"{self.engine_name}: flush_cache"
            )
            if ok:
                return
            refusals.append(message or "refused")
        raise WeightSyncError(
            f"{self.engine_name} could not flush its prefix cache after the weight sync in {FLUSH_ATTEMPTS} attempts "
            f"({'; '.join(refusals)}): its scheduler still held requests, and cached prefixes would hold the old "
            "weights' KV. Check the engine's log (#running-req, #queue-req) for requests that never finish."
        )

    async def _after_load(self, header, last_sync: dict) -> None:
        self.last_sync = last_sync
        if self.verify_sync and header.probe_logits is not None:
            await self._check_probe(header)

    async def _sync(self, version: int | None = None) -> None:
        """One weight sync (the route of the placement); the engine then holds weight version ``version``
        (``rollout_serving.next_weight_version``)."""
        target = next_weight_version(self.gate.version, version)
        if self.distributed:
            await self._receive_distributed(target)
        else:
            await self._receive_and_load(target)

    async def _receive_and_load(self, target: int) -> None:
        if self.sync_routes is None:
            raise RuntimeError("sync_model_from_actor before set_weight_sync: the runner sets the routes at start")
        control, begun, loaded = self.control, False, False

        async def begin():  # the actor's probe is done: the engine may take its weight memory back
            nonlocal begun
            # the requests in flight finish on the old weights; new ones wait
            await self.gate.pause(self.engine_name, self.sync_timeout_s)
            if self.released:
                await control.resume(WEIGHTS_TAGS)
            await control.begin_update()
            begun = True

        async def load(messages):
            await control.update(rank_payloads(messages, self.tp, control.serialize))

        try:
            headers, stats = await receive_weights(
                self,
                self.sync_routes,
                load,
                actor_group=self.cfg.actor.group_name,
                rollout_group=self.cfg.rollout.group_name,
                on_header=begin,
            )
            loaded = True
        finally:
            if self.gate.paused:  # close the update and give the engine its cache back even when the sync broke off
                await self._reopen(begun, loaded, target)
        await self._after_load(headers[0], {"sources": [h.sender for h in headers], **vars(stats)})

    async def _check_probe(self, header) -> None:
        ids = header.probe_ids.reshape(-1).tolist()
        extra = {"image_data": [img.data for img in header.probe_images]} if header.probe_images else {}
        result = await self.control.generate(
            input_ids=ids,
            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
            return_logprob=True,
            logprob_start_len=0,
            **extra,
        )
        gap = probe_logprob_gap(
            header.probe_ids, header.probe_logits, result["meta_info"][INPUT_TOKEN_LOGPROBS], header.probe_positions
        )
        self.last_sync_logprob_gap = gap
        if not gap <= self.sync_atol:
            raise WeightSyncError(
                f"SGLang's probe log-probs differ from the actor's by {gap:.3g} nats on average (> {self.sync_atol}) "
                "after weight sync: the Megatron->HF mapping or the load is wrong. Check rlinf_ext/convert/mapping.py "
                "for this model."
            )

    async def get_state(self) -> dict:
        return {
            "weight_version": self.weight_version,
            "last_sync_logprob_gap": self.last_sync_logprob_gap,
            "last_sync": self.last_sync,
            "requests_served": self.requests_served,
            RETOKENIZE_MISMATCH: self.retokenize_mismatches / max(self.requests_served, 1),
            RETOKENIZE_COUNTS: (int(self.retokenize_mismatches), self.requests_served),
        }  # the runner's per-step rate


def vl_request_parts(tokenizer: Any, model_path: str) -> tuple:
    """What a vision-language request needs: the vision token ids, the banned ids (vision specials, padded
    vocabulary rows) and SGLang's serialised disallowed-tokens processor (``generation/sglang_vl.py``)."""
    ids = tuple(int(tokenizer.convert_tokens_to_ids(t)) for t in (VISION_START, IMAGE_PAD, VISION_END))
    vocab = text_vocab_size(load_hf_config_dict(model_path))
    return ids, banned_token_ids(tokenizer, max(vocab, len(tokenizer))), disallowed_tokens_processor()


class SGLangRolloutWorker(SGLangRolloutState, Worker):
    """The RLinf worker (an async actor) around ``SGLangRolloutState``: one SGLang engine on this worker's TP GPUs."""

    def __init__(self, cfg: ExperimentConfig, verify_sync: bool = True, sync_atol: float | None = None):
        Worker.__init__(self)
        self._setup(cfg, verify_sync, sync_atol)

    async def init_worker(self) -> None:
        from transformers import AutoTokenizer

        with self.worker_timer():
            rollout = self.cfg.rollout
            model_path = str(rollout.model.model_path)
            kwargs = server_kwargs(
                self.cfg,
                tp_size=self.tp,
                seed=int(self.cfg.runner.seed) + int(self._rank),
                load_format="dummy",
                training=True,
                memory_saver=self.collocated,
            )
            kwargs.update(vl_server_overrides(str(rollout.model.model_type)))
            engine = load_engine_class()(**kwargs)
            tokenizer = AutoTokenizer.from_pretrained(model_path)
            vl = vl_request_parts(tokenizer, model_path) if str(rollout.model.model_type) == "qwen2.5_vl" else None
            self._attach(
                SGLangControl(engine),
                lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
                hf_eos_ids(model_path, tokenizer),
                SamplingParams.from_config(self.cfg.algorithm.sampling_params),
                vl,
            )
            if self.collocated:  # as RLinf: the actor initialises next on the same GPUs
                await self._release()

    async def sync_model_from_actor(self, version: int | None = None) -> None:
        """Receive the actor's weights (HF names, bucket by bucket) into the engine and check the probe; the engine
        then holds weight version ``version`` (None: one more than before)."""
        with self.worker_timer():
            await self._sync(version)
            torch.cuda.ipc_collect()  # handles the engine has let go of can be freed on the actor's side

    async def offload_engine(self) -> None:
        """Collocated: release weights, KV cache and CUDA graphs for training (the next sync brings them back)."""
        with self.worker_timer():
            await self._release()

    async def onload_engine(self) -> None:  # the next weight sync resumes the engine (weights, then the cache)
        with self.worker_timer():
            pass

    def shutdown_engine(self) -> None:
        if self.control is not None:
            self.control.shutdown()
