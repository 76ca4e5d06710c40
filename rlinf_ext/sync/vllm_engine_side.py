"""The engine side of vllm 0.32.0's weight transfer on an ``AsyncLLM``: ``VLLMGpuSync`` answers the actor's trainer
engine (``sync/vllm_transfer.py``), then leaves the engine serving. NOT GPU-verified (tests/sync/test_vllm_transfer.py).

``ipc``: after each rollout ``sleep(level=rollout.vllm.sleep_level, mode="wait")`` (in-flight requests finish first);
START wakes only the weights (the KV stays asleep, so vLLM's scheduler stays paused); after ``SYNC_END``, sent once
every actor rank freed its transfer memory, the KV wakes, prefix and encoder caches reset, generation resumes.
``nccl``: no sleep; START pauses ``mode="wait"`` (``keep`` under ``runner.partial_rollout``: the turns go on after
``serve`` with the new weights, KV recomputed, tokens labelled by version). FINISH labels the weights
``next_version`` (vLLM's per-token ``weight_versions``). A broken transfer still leaves the engine serving (update
finished, tags woken, resumed; after a level-2 sleep without weights until the next sync, which the error prevents)."""

from __future__ import annotations

from typing import Any, Literal

from rlinf_ext.sync.vllm_transfer import FINISH, INIT, START, UPDATE
from rlinf_ext.sync.weight_sync import WeightSyncError

# vLLM's memory tags of a sleeping engine (vllm/v1/executor/abstract.py: SLEEP_TAGS), woken in this order
WEIGHTS_TAG = "weights"
KV_CACHE_TAG = "kv_cache"
SLEEP_TAGS = (WEIGHTS_TAG, KV_CACHE_TAG)


class VLLMGpuSync:
    """The engine side of one rollout rank's vLLM transfers: ``after_rollout``, ``handle`` (one ``EngineCall``),
    ``serve`` (after ``SYNC_END`` or a broken transfer). Tracks what vLLM's engine holds back: the tags asleep,
    a paused scheduler, an update between start and finish."""

    def __init__(self, engine: Any, backend: Literal["ipc", "nccl"], *, sleep_level: int = 2, keep: bool = False):
        self.engine, self.backend, self.sleep_level = engine, backend, int(sleep_level)
        self.keep = keep  # partial rollout: a sync cuts the turns in flight instead of waiting for them
        self.asleep: list[str] = []  # memory tags asleep, in wake-up order
        self.paused = False  # the scheduler holds new requests back (a sleep or pause_generation)
        self.updating = False  # between a successful start_weight_update and its finish
        self.next_version: int | None = None  # the label of the weights the current sync brings (set by the worker)

    async def after_rollout(self) -> None:
        if self.backend == "ipc" and not self.asleep:
            await self.engine.sleep(level=self.sleep_level, mode="wait")
            self.asleep, self.paused = list(SLEEP_TAGS), True

    async def handle(self, call: Any) -> None:
        """One ``EngineCall`` (method + payload) from the trainer."""
        from vllm.distributed.weight_transfer.base import (  # lazy: vllm is slow to import
            WeightTransferInitRequest,
            WeightTransferUpdateRequest,
        )

        if call.method == INIT:
            await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=dict(call.payload)))
        elif call.method == START:
            await self.begin()
        elif call.method == UPDATE:
            if not self.updating:
                raise RuntimeError("update_weights before start_weight_update")
            await self.engine.update_weights(WeightTransferUpdateRequest(update_info=call.payload))
        elif call.method == FINISH:
            await self.finish_update()
        else:
            raise ValueError(f"unknown weight-transfer call {call.method!r}")

    async def begin(self) -> None:
        if WEIGHTS_TAG in self.asleep:
            await self.engine.wake_up(tags=[WEIGHTS_TAG])
            self.asleep.remove(WEIGHTS_TAG)
        elif not self.paused:
            # marked first: vLLM pauses its scheduler before the wait for the requests in flight ends, so a START cut
            # short by its timeout leaves the engine paused, and serve() must resume it (as after a refused INIT)
            self.paused = True
            await self.engine.pause_generation(mode="keep" if self.keep else "wait")
        await self.engine.start_weight_update()
        self.updating = True

    async def finish_update(self) -> None:
        if not self.updating:
            raise RuntimeError("finish_weight_update before start_weight_update")
        self.updating = False
        label = None if self.next_version is None else str(int(self.next_version))
        await self.engine.finish_weight_update(label)

    async def serve(self) -> None:
        """The engine serves again: an update broken off is finished, the tags still asleep are woken (the KV
        cache, or everything after a refused INIT/START), the caches reset, generation resumed."""
        try:
            if self.updating:  # the transfer broke off between start and finish
                self.updating = False
                await self.engine.finish_weight_update(None)
        finally:
            try:
                if self.asleep:
                    tags, self.asleep = self.asleep, []
                    if not await self.engine.wake_up(tags=tags):  # vLLM resumes scheduling once fully awake
                        raise WeightSyncError(f"vLLM's engine is still partly asleep after wake_up({tags})")
            finally:
                if self.paused:
                    self.paused = False
                    await self.engine.reset_prefix_cache()  # vLLM #46125: not reset automatically after an update
                    await self.engine.reset_encoder_cache()  # vision embeddings of the old weights (VL models)
                    await self.engine.resume_generation()
