"""vLLM rollout worker: serves the agent loop's generate requests with ``generation/vllm_engine.py:VLLMGenerator``
(Qwen2.5-VL: ``generation/vllm_vl.py:VLLMVLGenerator``, images with every request and the probe).

Same serving loop, replies and receive side as ``workers/rollout_hf.py``; vLLM returns no logits, so the probe
compares prompt log-probs with the actor's logits (``sync/probe.py:probe_logprob_gap``). Weight versions: vLLM's own
labels (``CompletionOutput.weight_versions``), 0 at start and the sync's version (None: one more) at each sync; the
wait and its exception: docs/contracts.md §3. ``runner.partial_rollout``: vLLM's keep pause stops the turns after
the step in progress; they go on with the new weights (KV recomputed), one version per token, stop strings found on
the whole turn. CPU (in process): pause (at most ``sync_timeout_s``, then names the stuck requests), layerwise
in-place reload per bucket, prefix-cache reset, label, resume; GPU (``AsyncLLM``): ``sync/vllm_engine_side.py``."""

from __future__ import annotations

import time

from rlinf.scheduler import Worker

from rlinf_ext.generation.vllm_engine import VLLMGenerator
from rlinf_ext.generation.vllm_vl import VLLMVLGenerator
from rlinf_ext.generation.vllm_wire import options_from_config
from rlinf_ext.protocol.generation import (
    GenerateReply,
    GenerateRequest,
    SamplingParams,
    reply_of,
    sampling_params_from_request,
)
from rlinf_ext.protocol.metric_keys import RETOKENIZE_COUNTS, RETOKENIZE_MISMATCH
from rlinf_ext.sync.engine_calls import SYNC_TIMEOUT_S, serve_engine_calls
from rlinf_ext.sync.probe import probe_atol, probe_logprob_gap
from rlinf_ext.sync.vllm_engine_side import VLLMGpuSync
from rlinf_ext.sync.vllm_transfer import ENGINE_CALLS
from rlinf_ext.sync.weight_sync import SyncRoutes, WeightSyncError, named_tensors_of, receive_weights
from rlinf_ext.workers.rollout_serving import (
    INITIAL_WEIGHT_VERSION,
    InFlight,
    next_weight_version,
    serve_requests,
    timed_pause,
)

# the parts of one weight sync on this side (seconds), logged as time/sync/<part> (runner/trainer.py:part_metrics)
SYNC_HEADER_WAIT = "header_wait"  # until the actor's header is in (its probe forward, the first conversion)
SYNC_LOAD = "load"  # pause (or wake-up), the buckets' transfer and load, layerwise finish, cache resets, resume
SYNC_PROBE = "probe"  # the probe's prompt log-probs through the engine and the comparison


class VLLMRolloutState:
    """The worker's logic without RLinf's ``Worker`` (tests drive it with fake channels and a fake transport)."""

    def _setup(self, cfg, verify_sync: bool = True, sync_atol: float | None = None) -> None:
        """``sync_atol`` None: the probe's tolerance for the engine's precision (``sync/probe.py:probe_atol``)."""
        self.cfg = cfg
        self.verify_sync = verify_sync
        self.sync_atol = probe_atol(str(cfg.rollout.model.precision)) if sync_atol is None else float(sync_atol)
        self.generator: VLLMGenerator | None = None
        self.gpu_sync: VLLMGpuSync | None = None
        self.defaults = SamplingParams()
        self.weight_version = INITIAL_WEIGHT_VERSION  # what the engine's label says (vLLM stamps it on replies)
        self.last_sync_logprob_gap: float | None = None
        self.last_sync: dict | None = None
        self.sync_routes: SyncRoutes | None = None
        self.requests_served = 0
        self.requests = InFlight()  # vLLM pauses by itself; these name what a pause that timed out waited for
        self.sync_timeout_s = SYNC_TIMEOUT_S  # the longest a sync waits for the requests in flight, or for one call
        self.partial = bool(cfg.runner.partial_rollout)  # a sync cuts the turns in flight (the module docstring)

    def _attach(self, generator: VLLMGenerator, defaults: SamplingParams) -> None:
        self.generator, self.defaults = generator, defaults
        options = getattr(generator, "options", None)
        if not generator.in_process and options is not None and options.weight_transfer_backend:
            self.gpu_sync = VLLMGpuSync(
                generator.engine,
                options.weight_transfer_backend,
                sleep_level=int(self.cfg.rollout.vllm.sleep_level),
                keep=self.partial,
            )

    async def _generate(self, request: GenerateRequest) -> GenerateReply:
        params = sampling_params_from_request(self.defaults, request.get("sampling_params"))
        seed = request.get("seed")  # vLLM's per-request seed: reproducible without serving one request at a time
        with self.requests.track(request["channel_key"]):
            result = await self.generator.generate(
                request["prompt_ids"],
                params,
                request.get("images") or None,
                seed=None if seed is None else int(seed),
                priority=int(request.get("priority", 0)),
            )
        self.requests_served += 1
        return reply_of(result)

    async def rollout_serverless(self, input_channel, output_channel) -> None:
        """Serve generate requests until a ``STOP_SERVING`` request arrives."""
        await serve_requests(input_channel, output_channel, self._generate)

    async def set_weight_sync(self, routes: SyncRoutes) -> None:
        self.sync_routes = routes

    async def _label_initial_weights(self) -> None:
        """The engine's weights before any sync: ``INITIAL_WEIGHT_VERSION`` (vLLM's own label is "default")."""
        await self.generator.label_weights(self.weight_version)

    async def _receive_and_load(self, version: int | None = None) -> dict[str, float]:
        """Receive, load and label weight version ``version`` (``rollout_serving.next_weight_version``). Returns the
        sync's parts in seconds (``SYNC_*``): the wait for the actor's header (its conversion starts and its probe
        forward), the transfer and load, the probe."""
        if self.sync_routes is None:
            raise RuntimeError("sync_model_from_actor before set_weight_sync: the runner sets the routes at start")
        gen, gpu = self.generator, self.gpu_sync
        target = next_weight_version(self.weight_version, version)
        t0 = time.perf_counter()
        if gpu is not None:
            gpu.next_version = target
            header = await self._serve_transfer(gpu)
            self.weight_version = target
            self.last_sync = {"sources": [header.sender], "backend": gpu.backend}
            t1 = time.perf_counter()
            await self._check_probe(header)
            return {SYNC_LOAD: t1 - t0, SYNC_PROBE: time.perf_counter() - t1}
        begun, loaded = False, False  # CPU: vLLM's in-place reload, fed by the RLinf routes
        t_header = t0

        async def begin():
            nonlocal begun, t_header
            t_header = time.perf_counter()
            await timed_pause(
                gen.begin_weight_load(keep=self.partial),
                f"vLLM rollout rank {self._rank}",
                self.requests,
                self.sync_timeout_s,
            )  # resumes generation when it is cut short
            begun = True

        async def load(messages):  # one message: one engine per rollout rank
            await gen.load_weight_bucket(named_tensors_of(messages[0]))

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
            if begun:  # resume serving even when the sync broke off (the probe below then refuses the weights)
                await gen.finish_weight_load(target if loaded else None)
        header = headers[0]
        self.weight_version = target
        self.last_sync = {"sources": [h.sender for h in headers], "load_s": gen.last_load_s, **vars(stats)}
        t1 = time.perf_counter()
        await self._check_probe(header)
        return {SYNC_HEADER_WAIT: t_header - t0, SYNC_LOAD: t1 - t_header, SYNC_PROBE: time.perf_counter() - t1}

    async def _serve_transfer(self, gpu: VLLMGpuSync):
        """GPU: answer the actor's vLLM transfer calls, then serve again whatever happened: after ``SYNC_END`` (the
        actor ranks have freed their transfer memory, so a collocated engine maps its KV cache again only now), or
        after a broken transfer (asleep or mid-update: woken fully and resumed)."""
        try:
            return await serve_engine_calls(
                self,
                gpu.handle,
                actor_group=self.cfg.actor.group_name,
                methods=ENGINE_CALLS,
                timeout_s=self.sync_timeout_s,
            )
        finally:
            await gpu.serve()

    async def _check_probe(self, header) -> None:
        gen = self.generator
        if self.verify_sync and header.probe_logits is not None:
            ids = header.probe_ids.reshape(-1).tolist()
            entries = await (
                gen.prompt_logprobs(ids, images=header.probe_images)
                if header.probe_images
                else gen.prompt_logprobs(ids)
            )  # the multimodal probe carries its images
            gap = probe_logprob_gap(header.probe_ids, header.probe_logits, entries, header.probe_positions)
            self.last_sync_logprob_gap = gap
            if not gap <= self.sync_atol:
                raise WeightSyncError(
                    f"vLLM's probe log-probs differ from the actor's by {gap:.3g} nats on average (> {self.sync_atol:g}) "
                    "after weight sync: the Megatron->HF mapping or the load is wrong."
                )

    async def get_state(self) -> dict:
        state = {
            "weight_version": self.weight_version,
            "last_sync_logprob_gap": self.last_sync_logprob_gap,
            "last_sync": self.last_sync,
            "requests_served": self.requests_served,
        }
        if isinstance(self.generator, VLLMVLGenerator):  # vLLM expanded an image differently from the actor's ids
            state[RETOKENIZE_MISMATCH] = self.generator.mismatch_rate
            state[RETOKENIZE_COUNTS] = self.generator.mismatch_counts  # the runner's per-step rate
        return state


class VLLMRolloutWorker(VLLMRolloutState, Worker):
    """The RLinf worker (an async actor) around ``VLLMRolloutState``."""

    def __init__(self, cfg, verify_sync: bool = True, sync_atol: float | None = None):
        Worker.__init__(self)
        self._setup(cfg, verify_sync, sync_atol)

    async def init_worker(self) -> dict[str, float]:
        """Start the engine; returns its start-up's parts in seconds (``vllm_engine.START_*``), which the trainer
        logs as ``time/rollout_start/<part>``."""
        with self.worker_timer():
            options = options_from_config(self.cfg, self._rank)
            engine = VLLMVLGenerator if self.cfg.rollout.model.model_type == "qwen2.5_vl" else VLLMGenerator
            generator = engine.start(options, return_logprobs=bool(self.cfg.rollout.return_logprobs))
            generator.options = options
            self._attach(generator, SamplingParams.from_config(self.cfg.algorithm.sampling_params))
            await self._label_initial_weights()
            if self.gpu_sync is not None:  # collocated: the actor starts on this GPU next (the first sync wakes it)
                await self.gpu_sync.after_rollout()
        return dict(generator.start_parts)

    async def sync_model_from_actor(self, version: int | None = None) -> dict[str, float]:
        """Receive the actor's weights (HF names, bucket by bucket) into the running engine and check the probe; the
        engine then holds weight version ``version`` (None: one more than before). Returns the sync's parts in
        seconds (the trainer logs them as ``time/sync/<part>``)."""
        with self.worker_timer():
            return await self._receive_and_load(version)

    async def offload_engine(self) -> None:
        """GPU collocated: release the GPU for training (``rollout.vllm.sleep_level``, after the requests in flight);
        disaggregated and CPU: nothing."""
        with self.worker_timer():
            if self.gpu_sync is not None:
                await self.gpu_sync.after_rollout()

    async def onload_engine(self) -> None:  # the next weight sync wakes the engine up (weights, then KV cache)
        with self.worker_timer():
            pass

    def shutdown_engine(self) -> None:
        if self.generator is not None:
            self.generator.shutdown()
