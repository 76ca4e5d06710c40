"""CPU rollout worker: serves the agent loop's generate requests with ``HFGenerator`` (transformers).

Same protocol as RLinf's ``SGLangWorker`` in serverless mode: an async actor whose
``rollout_serverless(input_channel, output_channel)`` takes ``GenerateRequest`` dicts and puts the
``GenerateReply`` under ``key=channel_key`` (``protocol/generation.py``), stamped with the weight version that
generated it; ``sync_model_from_actor(version)`` waits for the requests in flight, then receives the actor's weights
(HF names, ``sync/weight_sync.py``'s routes: shared-memory handles from the actor rank with the same index, or a
broadcast from actor rank 0) and checks the logits; ``offload_engine``/``onload_engine`` are no-ops.

Unlike RLinf's workers, ``sampling_params["stop"]`` reaches the engine (generation stops at ``</search>``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import torch
from rlinf.scheduler import Worker

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol.generation import (
    GenerateReply,
    GenerateRequest,
    SamplingParams,
    reply_of,
    sampling_params_from_request,
)
from rlinf_ext.protocol.vl_tokens import mm_token_type_ids
from rlinf_ext.sync.engine_calls import SYNC_TIMEOUT_S
from rlinf_ext.sync.weight_sync import (
    HFWeightLoader,
    SyncRoutes,
    check_logits_match,
    named_tensors_of,
    receive_weights,
)
from rlinf_ext.workers.rollout_serving import WeightGate, next_weight_version, serve_requests


class HFRolloutState:
    """The worker's logic without RLinf's ``Worker`` (tests drive it with fake channels and a fake transport).

    Deterministic mode generates requests one at a time (no cross-request batching), so a request's tokens
    depend only on its prompt, its sampling params and its seed, never on arrival order (used by the
    resume test and for reproducible runs); the default batches concurrent requests for throughput.
    Every reply carries the weight version that generated it: a sync waits for the requests in flight
    (``workers/rollout_serving.py:WeightGate``, paused once the actor's header is in, for at most ``sync_timeout_s``).
    With ``runner.partial_rollout`` (``partial``) the sync no longer waits for whole turns: the engine stops between
    decode steps (``generation/hf.py``: ``interruptible``, ``sync_pending``), each turn cut short leaves the gate and
    goes on after the sync on the new weights; its reply carries one version per token. Deterministic mode's
    one-at-a-time text path still waits for its turn (its seeded single call is not split).
    """

    def _setup(
        self, cfg: ExperimentConfig, deterministic: bool = False, verify_sync: bool = True, sync_atol: float = 1e-3
    ) -> None:
        self.cfg = cfg
        self.deterministic = deterministic
        self.verify_sync = verify_sync
        self.sync_atol = sync_atol
        self.generator = None
        self.defaults = SamplingParams()
        self.gate = WeightGate()
        self.sync_timeout_s = SYNC_TIMEOUT_S  # the longest a sync waits for the requests in flight
        self.last_sync_logit_diff: float | None = None
        self.last_sync: dict | None = None  # sources and sizes of the last weight sync
        self.sync_routes: SyncRoutes | None = None
        self.requests_served = 0
        self.partial = bool(cfg.runner.partial_rollout)  # runner.partial_rollout (the class docstring)

    @property
    def weight_version(self) -> int:
        return self.gate.version

    async def _generate(self, request: GenerateRequest) -> GenerateReply:
        params = sampling_params_from_request(self.defaults, request.get("sampling_params"))
        images = request.get("images") or None  # vision-language requests carry every image of the context
        if self.generator.interruptible and not self.deterministic:
            return await self._generate_across_syncs(request, params)
        async with self.gate.turn(request["channel_key"]) as version:
            if self.deterministic and not images:
                seed = int(request.get("seed", 0))

                def run():
                    torch.manual_seed(seed)
                    return self.generator.generate_batch_sync([request["prompt_ids"]], params)[0]

                result = await asyncio.to_thread(run)
            elif images:
                if self.deterministic:  # requests are served one at a time (rollout_serverless): the seed holds
                    torch.manual_seed(int(request.get("seed", 0)))
                result = await self.generator.generate(
                    request["prompt_ids"], params, images=images, priority=int(request.get("priority", 0))
                )
            else:
                result = await self.generator.generate(
                    request["prompt_ids"], params, priority=int(request.get("priority", 0))
                )
        self.requests_served += 1
        return reply_of(replace(result, weight_version=version))

    async def _generate_across_syncs(self, request: GenerateRequest, params: SamplingParams) -> GenerateReply:
        """Partial rollout: each segment of the turn enters the gate on its own, so a sync waits only for the
        decode step in progress; the engine stamps each token with the version of its segment."""
        key = request["channel_key"]
        result = await self.generator.generate(
            request["prompt_ids"],
            params,
            request.get("images") or None,
            turn=lambda: self.gate.turn(key),
            priority=int(request.get("priority", 0)),
        )
        self.requests_served += 1
        return reply_of(result)

    async def rollout_serverless(self, input_channel, output_channel) -> None:
        """Serve generate requests until a ``STOP_SERVING`` request arrives (RLinf's loop never ends); deterministic
        mode one at a time (see the class docstring)."""
        await serve_requests(input_channel, output_channel, self._generate, one_at_a_time=self.deterministic)

    async def set_weight_sync(self, routes: SyncRoutes) -> None:
        """Who sends this rank its weights (``sync/weight_sync.py``); called once by the runner."""
        self.sync_routes = routes

    async def _receive_and_load(self, version: int | None = None) -> None:
        """Receive the actor's weights (HF names, bucket by bucket) once the requests in flight have finished, load
        them, take ``version`` (``rollout_serving.next_weight_version``), serve again, then check the logits."""
        if self.sync_routes is None:
            raise RuntimeError("sync_model_from_actor before set_weight_sync: the runner sets the routes at start")
        target = next_weight_version(self.gate.version, version)
        model = self.generator.model
        loader = HFWeightLoader(model)
        loaded = False

        async def pause():  # the actor's header is in: the requests in flight finish on the old weights, or
            # (partial rollout) stop after their current decode step
            if self.generator.interruptible:
                self.generator.sync_pending.set()
            await self.gate.pause(f"HF rollout rank {self._rank}", self.sync_timeout_s)

        async def load(messages):  # one message: the HF engine has no tensor parallelism
            loader.load(named_tensors_of(messages[0]))

        try:
            headers, stats = await receive_weights(
                self,
                self.sync_routes,
                load,
                actor_group=self.cfg.actor.group_name,
                rollout_group=self.cfg.rollout.group_name,
                on_header=pause,
            )
            loader.finish()
            loaded = True
        finally:
            self.generator.sync_pending.clear()  # before the gate opens: the turns cut short go on
            if self.gate.paused:  # serve again even when the sync broke off (the run stops on its error)
                self.gate.resume(target if loaded else None)
        header = headers[0]
        self.last_sync = {"sources": [h.sender for h in headers], **vars(stats)}
        if self.verify_sync and header.probe_logits is not None:
            with torch.no_grad():
                vision = self.generator.images.batch(header.probe_images) if header.probe_images else {}
                if vision:  # transformers 5: mrope positions only with the modality ids (else text-only)
                    vision["mm_token_type_ids"] = mm_token_type_ids(header.probe_ids, self.generator.image_pad_id)
                logits = model(input_ids=header.probe_ids, **vision).logits.float()
            expected = header.probe_logits
            if header.probe_positions is not None:  # multimodal probe: the text after the image
                expected, logits = expected[:, header.probe_positions], logits[:, header.probe_positions]
            self.last_sync_logit_diff = check_logits_match(expected, logits, self.sync_atol)

    async def get_state(self) -> dict:
        """Version of the loaded weights and the last logits check (for tests and logs)."""
        return {
            "weight_version": self.weight_version,
            "last_sync_logit_diff": self.last_sync_logit_diff,
            "last_sync": self.last_sync,
            "requests_served": self.requests_served,
        }


class HFRolloutWorker(HFRolloutState, Worker):
    """The RLinf worker (an async actor) around ``HFRolloutState``: generation on CPU with transformers;
    ``deterministic`` seeds every request by its ``seed``."""

    def __init__(
        self, cfg: ExperimentConfig, deterministic: bool = False, verify_sync: bool = True, sync_atol: float = 1e-3
    ):
        Worker.__init__(self)
        self._setup(cfg, deterministic, verify_sync, sync_atol)

    async def init_worker(self) -> None:
        with self.worker_timer():
            rollout = self.cfg.rollout
            torch.manual_seed(int(self.cfg.runner.seed) + self._rank)
            # lazy: heavy (transformers); loaded in the rollout's process only, never in the launcher
            from rlinf_ext.generation.hf import HFGenerator
            from rlinf_ext.generation.hf_vl import HFVLGenerator

            engine = HFVLGenerator if rollout.model.model_type == "qwen2.5_vl" else HFGenerator
            self.generator = engine.from_pretrained(
                rollout.model.model_path,
                dtype=str(rollout.hf.dtype),
                max_batch_size=int(rollout.hf.max_batch_size),
                return_logprobs=bool(rollout.return_logprobs),
            )
            # the deterministic text path generates each request in one seeded call, which a sync does not split
            self.generator.interruptible = self.partial and not self.deterministic
            self.defaults = SamplingParams.from_config(self.cfg.algorithm.sampling_params)

    async def sync_model_from_actor(self, version: int | None = None) -> None:
        """Receive the actor's weights and check the logits; the engine then holds weight version ``version``
        (None: one more than before)."""
        with self.worker_timer():
            await self._receive_and_load(version)

    async def offload_engine(self) -> None:  # CPU engine: nothing to release
        with self.worker_timer():
            pass

    async def onload_engine(self) -> None:
        with self.worker_timer():
            pass
