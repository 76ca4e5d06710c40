"""GPU rollout: RLinf's SGLang worker, fixed for the Search-R1 agent loop (NOT GPU-verified).

What RLinf 0.3.0's ``SGLangWorker`` gets wrong for us, and what ``SGLangStopWorker`` changes:
- ``get_sampling_param_from_config`` drops ``stop``; requests are merged key by key, so each request's
  ``SamplingParams`` fields are translated into SGLang's names, ``stop`` included
  (``generation/sglang.py:to_sglang_params``).
- the reply has no ``text``/``matched_stop`` and a raw finish reason; ``generation/sglang.py:sglang_reply`` builds
  the same ``GenerateReply`` as the CPU HF worker (``protocol/generation.py:reply_of``): decoded ``text`` (SGLang's when it detokenizes, else ours),
  ``finish_reason`` in ``stop|eos|length``, ``matched_stop``, ``logprobs``, ``num_generated``.
- ``rollout_serverless`` never returns; ours stops on ``STOP_SERVING`` like the CPU worker (the trainer's
  ``shutdown`` waits for it) and answers a failed request with ``{"error": ...}`` instead of hanging the caller.
- weight sync: RLinf's scheduler receives Megatron buckets from RLinf's actor; our actor sends one
  ``SyncPayload`` (HF names) per rollout rank, which is loaded with SGLang's ``update_weights_from_tensor``
  and checked on the probe sequence (``probe_logprob_gap``). The engine therefore runs with RLinf's
  ``weight_reload=None`` (weights from ``rollout.model.model_path`` at start) and offloads itself only when
  collocated with the actor.
vLLM: RLinf's ``VLLMWorker`` has no serving loop (``rollout_serverless``), so it cannot serve the agent
runner (``rollout_worker_class`` refuses it). Imports of sglang stay inside the functions that need it: it is a
GPU extra and importing it initialises CUDA.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import torch

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.generation.sglang import import_rlinf_sglang, sglang_reply, to_sglang_params
from rlinf_ext.protocol.generation import STOP_SERVING
from rlinf_ext.workers.weight_sync import WeightSyncError

# Mean |logprob difference| (nats) allowed between the engine and the actor on the probe after a sync. bf16/fp16
# engines differ from the actor by rounding (~0.01-0.1); a wrong mapping or a partial load differs by nats.
GPU_SYNC_MEAN_ATOL = 0.5
WEIGHT_BUCKET_BYTES = 1 << 30  # weights cross to the engine in ~1 GiB pieces (bounded extra GPU memory)


def probe_logprob_gap(probe_ids: torch.Tensor, actor_logits: torch.Tensor, input_token_logprobs: list) -> float:
    """Mean |engine - actor| log-prob of the probe's tokens 1..L-1 (pure).

    ``actor_logits`` [1, L, V] from the ``SyncPayload``; ``input_token_logprobs`` = SGLang's
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
    return float((expected - torch.tensor(values, dtype=torch.float32)).abs().mean())


def weight_buckets(state: dict[str, torch.Tensor], max_bytes: int = WEIGHT_BUCKET_BYTES) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Split a state dict into lists of ``(name, tensor)`` of at most ``max_bytes`` (a bigger tensor goes alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def make_sglang_stop_worker():
    """The SGLang worker subclass (imports sglang through RLinf; call only on GPU nodes)."""
    SGLangWorker = import_rlinf_sglang("rlinf.workers.rollout.sglang.sglang_worker", "SGLangWorker")

    class SGLangStopWorker(SGLangWorker):
        """``SGLangWorker(cfg, placement, weight_reload=None)`` + the fixes listed in the module docstring."""

        def __init__(self, config, placement, weight_reload=None, config_rollout=None, verify_sync: bool = True):
            super().__init__(config, placement, weight_reload=weight_reload, config_rollout=config_rollout)
            self._default_stop = list(self._cfg.algorithm.sampling_params.stop or [])
            self._verify_sync = verify_sync
            self._offloaded = False
            self.weight_version = -1
            self.last_sync_logprob_gap: float | None = None
            self.requests_served = 0

        async def init_worker(self):
            await super().init_worker()
            if self._placement.is_collocated:  # as RLinf: the actor initialises next on the same GPUs
                await self.offload_engine()

        # -------------------------------------------------------------- generation
        def _decode(self, ids: list[int]) -> str:
            return self._tokenizer.decode(ids, skip_special_tokens=False)

        async def generate_and_send(self, output_channel, channel_key, prompt_ids, sampling_params=None):
            request = dict(sampling_params or {})
            try:
                params = {**self._sampling_params, **to_sglang_params(request, self._default_stop)}
                result = await self._engine.async_generate(
                    input_ids=prompt_ids, sampling_params=params, return_logprob=self._return_logprobs
                )
                reply = sglang_reply(
                    result, self._decode,
                    include_stop_str_in_output=bool(request.get("include_stop_str_in_output", True)),
                    return_logprobs=self._return_logprobs,
                )
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
                    output_channel, req["channel_key"], req["prompt_ids"], req.get("sampling_params")
                ))
                pending.add(task)  # a reference, or the loop may drop the task
                task.add_done_callback(pending.discard)
            if pending:
                await asyncio.gather(*pending)

        # -------------------------------------------------------------- memory (collocated only)
        async def offload_engine(self):
            from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput

            if self._placement.is_collocated and not self._offloaded:
                await self._engine.tokenizer_manager.release_memory_occupation(obj=ReleaseMemoryOccupationReqInput())
                self._offloaded = True

        async def onload_engine(self):
            from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput

            if self._offloaded:
                await self._engine.tokenizer_manager.resume_memory_occupation(obj=ResumeMemoryOccupationReqInput())
                self._offloaded = False

        # -------------------------------------------------------------- weight sync (rollout side)
        async def sync_model_from_actor(self):
            """Receive the actor's ``SyncPayload``, load it into the engine, check the probe log-probs."""
            from rlinf.config import torch_dtype_from_precision
            from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
            from sglang.srt.utils import MultiprocessingSerializer

            payload = await self.recv(self._cfg.actor.group_name, 0, async_op=True).async_wait()
            await self.onload_engine()
            dtype = torch_dtype_from_precision(self._cfg_rollout.model.precision)
            tp = int(self._cfg_rollout.tensor_parallel_size)
            buckets = list(weight_buckets(payload.hf_state))
            for i, bucket in enumerate(buckets):
                # CUDA tensors cross to the scheduler processes as IPC handles (SGLang's own Engine path)
                named = [(k, v.to("cuda", dtype=dtype if v.is_floating_point() else v.dtype)) for k, v in bucket]
                obj = UpdateWeightsFromTensorReqInput(
                    serialized_named_tensors=[MultiprocessingSerializer.serialize(named) for _ in range(tp)],
                    load_format=None, flush_cache=i == len(buckets) - 1,
                )
                ok, message = await self._engine.tokenizer_manager.update_weights_from_tensor(obj, None)
                del named
                if not ok:
                    raise WeightSyncError(f"SGLang refused the actor's weights: {message}")
            torch.cuda.empty_cache()  # give the staging buckets back (a collocated actor needs the memory)
            self.weight_version = payload.version
            if self._verify_sync and payload.probe_logits is not None:
                result = await self._engine.async_generate(
                    input_ids=payload.probe_ids.reshape(-1).tolist(),
                    sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                    return_logprob=True, logprob_start_len=0,
                )
                gap = probe_logprob_gap(payload.probe_ids, payload.probe_logits, result["meta_info"]["input_token_logprobs"])
                self.last_sync_logprob_gap = gap
                if not gap <= GPU_SYNC_MEAN_ATOL:
                    raise WeightSyncError(
                        f"SGLang's probe log-probs differ from the actor's by {gap:.3g} nats on average (> "
                        f"{GPU_SYNC_MEAN_ATOL}) after weight sync: the Megatron->HF mapping or the load is wrong. "
                        "Check rlinf_ext/convert/mapping.py for this model."
                    )

        async def get_state(self) -> dict:
            return {"weight_version": self.weight_version, "last_sync_logprob_gap": self.last_sync_logprob_gap,
                    "requests_served": self.requests_served}

    return SGLangStopWorker


def rollout_worker_class(cfg: ExperimentConfig):
    backend = cfg.rollout.rollout_backend
    if backend == "sglang":
        return make_sglang_stop_worker()
    if backend == "vllm":
        raise NotImplementedError(
            "rollout.rollout_backend=vllm: RLinf 0.3.0's VLLMWorker has no rollout_serverless loop, so it cannot "
            "serve the agent loop; use sglang on GPU (or hf on CPU)."
        )
    raise ValueError(f"rollout.rollout_backend={backend!r} is not a GPU backend (sglang|vllm).")
