"""The engine side of vLLM's weight transfer (vllm 0.32.0, ``vllm/distributed/weight_transfer/``) on an ``AsyncLLM``
(NOT GPU-verified; the call order is tested with recording engines, tests/sync/test_vllm_transfer.py):
``VLLMGpuSync`` answers the control calls of the actor's vLLM trainer engine (``sync/vllm_transfer.py``), which the
rollout worker receives with ``sync/engine_calls.py:serve_engine_calls``.
"""

from __future__ import annotations

from typing import Any, Literal

from rlinf_ext.sync.vllm_transfer import FINISH, INIT, START, UPDATE


class VLLMGpuSync:
    """The engine side of vLLM's weight-transfer API on an ``AsyncLLM``: answers the trainer's control calls
    (``sync/engine_calls.py:EngineCall``) in order.

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

        if call.method == INIT:
            await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=dict(call.payload)))
        elif call.method == START:
            await self.begin()
        elif call.method == UPDATE:
            if not self.updating:
                raise RuntimeError("update_weights before start_weight_update")
            await self.engine.update_weights(WeightTransferUpdateRequest(update_info=call.payload))
        elif call.method == FINISH:
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
