"""GPU rollout: RLinf's SGLang worker, fixed for the Search-R1 agent loop (NOT GPU-verified).

What RLinf 0.3.0's ``SGLangWorker`` gets wrong for us, and what ``SGLangStopWorker`` changes:
- ``get_sampling_param_from_config`` drops ``stop``; requests are merged into the config's sampling params key
  by key (as the CPU worker does; ``stop`` is the request's own) and translated into SGLang's names, with
  ``stop_token_ids`` = the HF EOS set (``<|endoftext|>`` as well as ``<|im_end|>``) as the evaluation engine
  does (``generation/sglang_wire.py:to_sglang_params``).
- the reply has no ``text``/``matched_stop`` and a raw finish reason; ``generation/sglang_wire.py:sglang_reply``
  builds the same ``GenerateReply`` as the CPU HF worker (``protocol/generation.py:reply_of``), the turn's end
  classified as every engine's (``generation/turn_end.py``).
- ``rollout_serverless`` never returns; ours stops on ``STOP_SERVING`` like the CPU worker (the trainer's
  ``shutdown`` waits for it) and answers a failed request with ``{"error": ...}`` instead of hanging the caller.
- the engine: ``generation/sglang_engine.py:server_kwargs`` (one engine per TP group, ``dp_size=1``) with
  ``load_format="dummy"``: the first weight sync overwrites every weight, so nothing is read from disk. RLinf's
  ``weight_reload=None`` keeps its scheduler from expecting RLinf's Megatron buckets.
- weight sync: our actor's HF-named buckets (``sync/weight_sync.py``) go into SGLang's own
  ``update_weights_from_tensor``. Collocated, each TP scheduler receives handles to memory on its own GPU from
  the actor rank on that GPU (SGLang's ``LocalSerializedTensor``, one serialized tensor per TP rank);
  disaggregated, this worker receives actor rank 0's broadcast on its first GPU, copies each bucket to its
  other GPUs and passes handles the same way. Then the probe check (``probe_logprob_gap``).
vLLM: RLinf's ``VLLMWorker`` has no serving loop (``rollout_serverless``), so it cannot serve the agent
runner (``validate`` refuses it). Imports of sglang stay inside the functions that need it: it is a GPU
extra and importing it initialises CUDA.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable

import torch

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.generation.sglang_engine import import_rlinf_sglang, server_kwargs
from rlinf_ext.generation.sglang_wire import hf_eos_ids, sglang_reply, to_sglang_params
from rlinf_ext.generation.sglang_vl import disallowed_tokens_processor, mm_request, retokenize_mismatch, vl_server_overrides
from rlinf_ext.protocol.generation import STOP_SERVING, SamplingParams, sampling_params_from_request
from rlinf_ext.models.qwen2 import load_hf_config_dict
from rlinf_ext.protocol.metric_keys import RETOKENIZE_MISMATCH
from rlinf_ext.protocol.vl_tokens import IMAGE_PAD, VISION_END, VISION_START, banned_token_ids, text_vocab_size
from rlinf_ext.sync.weight_sync import (
    HandleBucket,
    SyncRoutes,
    WeightBucket,
    WeightSyncError,
    prepare_handles,
    receive_weights,
    share_bucket,
)

# Mean |logprob difference| (nats) allowed between the engine and the actor on the probe after a sync. bf16/fp16
# engines differ from the actor by rounding (~0.01-0.1); a wrong mapping or a partial load differs by nats.
GPU_SYNC_MEAN_ATOL = 0.5


def probe_logprob_gap(probe_ids: torch.Tensor, actor_logits: torch.Tensor, input_token_logprobs: list,
                      positions: list[int] | None = None) -> float:
    """Mean |engine - actor| log-prob of the probe's tokens 1..L-1 (pure); ``positions``: only those tokens (the
    multimodal probe compares the text after its image).

    ``actor_logits`` [1, L, V] from the ``SyncHeader``; ``input_token_logprobs`` = SGLang's
    ``meta_info["input_token_logprobs"]`` for the probe with ``logprob_start_len=0`` (entries
    ``(logprob, token_id, text)``, the first one ``None``: no context).
    """
    ids = probe_ids.reshape(-1)
    values = [entry[0] for entry in input_token_logprobs]
    if values and values[0] is None:
        values = values[1:]
    if len(values) != len(ids) - 1 or any(v is None for v in values):
        raise WeightSyncError(
            f"SGLang returned {len(values)} probe log-probs for {len(ids) - 1} positions; cannot check the sync."
        )
    expected = torch.log_softmax(actor_logits.reshape(len(ids), -1)[:-1].float(), dim=-1)
    expected = expected.gather(-1, ids[1:, None]).squeeze(-1)
    gaps = (expected - torch.tensor(values, dtype=torch.float32)).abs()  # entry j: token j + 1
    if positions is not None:
        gaps = gaps[torch.tensor([p - 1 for p in positions if p >= 1], dtype=torch.long)]
    return float(gaps.mean())


def request_params(defaults: SamplingParams, request: dict | None, eos_ids: list[int]) -> tuple[dict, SamplingParams]:
    """SGLang ``sampling_params`` of one generate request (pure): the request merged into the config's sampling
    params key by key (a request without ``temperature`` keeps the configured one), the request's ``stop``, and
    ``stop_token_ids`` = the HF EOS set (so ``<|endoftext|>`` ends a training turn as it ends an HF or an
    evaluation turn). Also returns the merged ``SamplingParams``."""
    params = sampling_params_from_request(defaults, request)
    return to_sglang_params(dataclasses.asdict(params), eos_ids), params


def slot_handles(messages: list, tp: int, to_device: Callable[[torch.Tensor, int], torch.Tensor]
                 ) -> tuple[list[HandleBucket], list[torch.Tensor]]:
    """One ``HandleBucket`` per TP slot of an engine (pure but for ``to_device``).

    Paired route: ``messages`` already are the TP slots' handle buckets (each from the actor rank on that slot's
    GPU). Broadcast route: one received ``WeightBucket`` on this worker's first GPU; ``to_device(flat, slot)``
    copies it to each slot's GPU, and the copies (returned, to keep alive until the engine has loaded them)
    are shared as handles, so no scheduler opens memory on another GPU.
    """
    if all(isinstance(m, HandleBucket) for m in messages):
        if len(messages) != tp:
            raise WeightSyncError(f"{len(messages)} handle bucket(s) for an engine of TP size {tp}")
        return list(messages), []
    (bucket,) = messages
    flats = [to_device(bucket.flat, slot) for slot in range(tp)]
    return [share_bucket(WeightBucket(flat, bucket.names, bucket.shapes)) for flat in flats], flats


def update_request_tensors(slots: list[HandleBucket], local_tensor_cls: Any) -> list[tuple[str, Any]]:
    """``named_tensors`` of SGLang's ``update_weights_from_tensor``: per name a ``LocalSerializedTensor`` whose
    value ``k`` is TP rank ``k``'s handle (SGLang's ``_unwrap_tensor`` opens ``values[tp_rank]``)."""
    names = slots[0].names
    if any(s.names != names for s in slots):
        raise WeightSyncError("the TP slots of one engine received different buckets")
    return [(name, local_tensor_cls(values=[s.handles[i] for s in slots])) for i, name in enumerate(names)]


def make_sglang_stop_worker():
    """The SGLang worker subclass (imports sglang through RLinf; call only on GPU nodes)."""
    SGLangWorker = import_rlinf_sglang("rlinf.workers.rollout.sglang.sglang_worker", "SGLangWorker")

    class SGLangStopWorker(SGLangWorker):
        """``SGLangWorker(cfg, placement, weight_reload=None)`` + the fixes listed in the module docstring."""

        def __init__(self, config, placement, weight_reload=None, config_rollout=None, verify_sync: bool = True):
            super().__init__(config, placement, weight_reload=weight_reload, config_rollout=config_rollout)
            self._defaults = SamplingParams.from_config(self._cfg.algorithm.sampling_params)
            self._eos_ids = hf_eos_ids(self._cfg_rollout.model.model_path, self._tokenizer)
            self._verify_sync = verify_sync
            self._offloaded = False
            self._sync_routes: SyncRoutes | None = None
            self.weight_version = -1
            self.last_sync_logprob_gap: float | None = None
            self.last_sync: dict | None = None
            self.requests_served = 0
            self.retokenize_mismatches = 0.0  # rollout/retokenize_mismatch: requests SGLang re-tokenised differently

        def _init_engine(self):
            """RLinf's engine class, started from ``server_kwargs`` (dummy weights: the first sync loads them)."""
            from rlinf.workers.rollout.sglang import Engine  # lazy: imports sglang (GPU extra, initialises CUDA)

            kwargs = server_kwargs(self._cfg, tp_size=int(self._cfg_rollout.tensor_parallel_size),
                                   seed=int(self._cfg.runner.seed) + int(self._rank), load_format="dummy",
                                   training=True)
            kwargs.update(vl_server_overrides(str(self._cfg_rollout.model.model_type)))  # NOT GPU-verified
            kwargs["dist_init_addr"] = f"127.0.0.1:{self.acquire_free_port()}"
            self._engine = Engine(**kwargs)

        async def init_worker(self):
            await super().init_worker()
            if self._placement.is_collocated:  # as RLinf: the actor initialises next on the same GPUs
                await self.offload_engine()

        # -------------------------------------------------------------- generation
        def _decode(self, ids: list[int]) -> str:
            return self._tokenizer.decode(ids, skip_special_tokens=False)

        def _vl_request(self, prompt_ids, images, sglang_params) -> dict:
            """Every image of the context plus the banned ids (NOT GPU-verified; ``generation/sglang_vl.py``)."""
            if not hasattr(self, "_vl"):
                tok = self._tokenizer
                ids = tuple(int(tok.convert_tokens_to_ids(t)) for t in (VISION_START, IMAGE_PAD, VISION_END))
                vocab = text_vocab_size(load_hf_config_dict(self._cfg_rollout.model.model_path))  # padded rows
                self._vl = (ids, banned_token_ids(tok, max(vocab, len(tok))), disallowed_tokens_processor())
            token_ids, banned, processor = self._vl
            return mm_request(prompt_ids, images, sglang_params, token_ids=token_ids, banned_ids=banned,
                              logit_processor=processor)

        async def generate_and_send(self, output_channel, channel_key, prompt_ids, sampling_params=None, images=None):
            try:
                sglang_params, params = request_params(self._defaults, sampling_params, self._eos_ids)
                if images:  # vision-language: SGLang re-tokenises the decoded ids with every image
                    request = self._vl_request(prompt_ids, images, sglang_params)
                    result = await self._engine.async_generate(**request, return_logprob=self._return_logprobs)
                    self.retokenize_mismatches += retokenize_mismatch(prompt_ids, result.get("meta_info") or {})
                else:
                    result = await self._engine.async_generate(
                        input_ids=prompt_ids, sampling_params=sglang_params, return_logprob=self._return_logprobs,
                    )
                reply = sglang_reply(result, self._decode, params, self._eos_ids, return_logprobs=self._return_logprobs)
            except Exception as exc:  # the agent loop gets the error instead of waiting forever
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            self.requests_served += 1
            await output_channel.put(reply, key=channel_key, async_op=True).async_wait()

        async def rollout_serverless(self, input_channel, output_channel):
            pending: set[asyncio.Task] = set()
            while True:
                req = await input_channel.get(async_op=True).async_wait()
                if req.get("channel_key") == STOP_SERVING:
                    break
                task = asyncio.get_running_loop().create_task(self.generate_and_send(
                    output_channel, req["channel_key"], req["prompt_ids"], req.get("sampling_params"),
                    req.get("images"),
                ))
                pending.add(task)  # a reference, or the loop may drop the task
                task.add_done_callback(pending.discard)
            if pending:
                await asyncio.gather(*pending)

        # -------------------------------------------------------------- memory (collocated only)
        async def offload_engine(self):
            from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput  # lazy: GPU extra

            if self._placement.is_collocated and not self._offloaded:
                await self._engine.tokenizer_manager.release_memory_occupation(obj=ReleaseMemoryOccupationReqInput())
                self._offloaded = True

        async def onload_engine(self):
            from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput  # lazy: GPU extra

            if self._offloaded:
                await self._engine.tokenizer_manager.resume_memory_occupation(obj=ResumeMemoryOccupationReqInput())
                self._offloaded = False

        # -------------------------------------------------------------- weight sync (rollout side)
        async def set_weight_sync(self, routes: SyncRoutes) -> None:
            self._sync_routes = routes

        async def sync_model_from_actor(self):
            """Receive the actor's buckets into SGLang's ``update_weights_from_tensor``, then check the probe."""
            from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput  # lazy: GPU extra
            from sglang.srt.model_executor.model_runner import LocalSerializedTensor  # lazy: GPU extra
            from sglang.srt.utils import MultiprocessingSerializer  # lazy: GPU extra

            if self._sync_routes is None:
                raise RuntimeError("sync_model_from_actor before set_weight_sync: the runner sets the routes at start")
            manager = self._engine.tokenizer_manager
            tp = int(self._cfg_rollout.tensor_parallel_size)
            prepare_handles(torch.device("cuda"))  # this process shares the broadcast route's copies

            async def load(messages):
                slots, keep_alive = slot_handles(messages, tp, lambda flat, slot: flat.to(f"cuda:{slot}"))
                blob = MultiprocessingSerializer.serialize(update_request_tensors(slots, LocalSerializedTensor))
                ok, message = await manager.update_weights_from_tensor(UpdateWeightsFromTensorReqInput(
                    serialized_named_tensors=[blob] * tp, load_format=None, flush_cache=False), None)
                del keep_alive  # loaded: the copies may go
                if not ok:
                    raise WeightSyncError(f"SGLang refused the actor's weights: {message}")

            headers, stats = await receive_weights(self, self._sync_routes, load, actor_group=self._cfg.actor.group_name,
                                                   rollout_group=self._cfg_rollout.group_name,
                                                   on_header=self.onload_engine)  # after the actor's probe
            flushed = await manager.flush_cache()
            if not getattr(flushed, "success", True):
                raise WeightSyncError("SGLang could not flush its prefix cache after the weight sync (requests were "
                                      "running); cached prefixes would hold the old weights' KV")
            torch.cuda.ipc_collect()  # the broadcast route's copies, shared with the schedulers, can go now
            torch.cuda.empty_cache()  # give the staging copies back (a collocated actor needs the memory)
            self.weight_version = headers[0].version
            self.last_sync = {"sources": [h.sender for h in headers], **vars(stats)}
            if self._verify_sync and headers[0].probe_logits is not None:
                await self._check_probe(headers[0])

        async def _check_probe(self, header) -> None:
            ids = header.probe_ids.reshape(-1).tolist()
            extra = {"image_data": [img.data for img in header.probe_images]} if header.probe_images else {}
            result = await self._engine.async_generate(
                input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                return_logprob=True, logprob_start_len=0, **extra,
            )
            gap = probe_logprob_gap(header.probe_ids, header.probe_logits, result["meta_info"]["input_token_logprobs"],
                                    header.probe_positions)
            self.last_sync_logprob_gap = gap
            if not gap <= GPU_SYNC_MEAN_ATOL:
                raise WeightSyncError(
                    f"SGLang's probe log-probs differ from the actor's by {gap:.3g} nats on average (> "
                    f"{GPU_SYNC_MEAN_ATOL}) after weight sync: the Megatron->HF mapping or the load is wrong. "
                    "Check rlinf_ext/convert/mapping.py for this model."
                )

        async def get_state(self) -> dict:
            return {"weight_version": self.weight_version, "last_sync_logprob_gap": self.last_sync_logprob_gap,
                    "last_sync": self.last_sync, "requests_served": self.requests_served,
                    RETOKENIZE_MISMATCH: self.retokenize_mismatches / max(self.requests_served, 1)}

    return SGLangStopWorker


def rollout_worker_class(cfg: ExperimentConfig):
    backend = cfg.rollout.rollout_backend
    if backend == "sglang":
        return make_sglang_stop_worker()
    raise ValueError(f"rollout.rollout_backend={backend!r} is not a GPU backend (sglang).")
