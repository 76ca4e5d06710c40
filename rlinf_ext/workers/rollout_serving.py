"""The rollout workers' serving loop, shared by every engine (``workers/rollout_hf.py``, ``workers/rollout_vllm.py``,
``workers/rollout_sglang.py``), and the weight versions they stamp on replies.

``serve_requests`` takes ``GenerateRequest`` dicts from the input channel and puts each ``GenerateReply`` under
``key=channel_key`` on the output channel (``protocol/generation.py``), until a ``STOP_SERVING`` request
arrives; a failed request is answered with ``{"error": ...}`` instead of leaving the agent loop waiting.

A weight sync may land while requests are being generated (the rollout workers are async actors: Ray runs
``sync_model_from_actor`` between the awaits of the serving loop). ``WeightGate`` is the pause in wait mode of an
engine that has none of its own (HF, and SGLang's worker): a sync stops admitting requests, waits for those in
flight, loads, takes the new version and admits again, so every reply was sampled by exactly one version.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from rlinf_ext.protocol.generation import STOP_SERVING, GenerateReply, GenerateRequest


async def serve_requests(input_channel, output_channel, generate: Callable[[GenerateRequest], Awaitable[GenerateReply]],
                         *, one_at_a_time: bool = False) -> None:
    """Serve until ``STOP_SERVING``; ``one_at_a_time`` answers each request before taking the next (deterministic
    engines), otherwise requests run concurrently and the loop waits for the last ones before returning."""
    pending: set[asyncio.Task] = set()

    async def serve(req: GenerateRequest) -> None:
        try:
            reply = await generate(req)
        except Exception as exc:  # the agent loop gets the error instead of waiting forever
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        await output_channel.put(reply, key=req["channel_key"], async_op=True).async_wait()

    while True:
        req = await input_channel.get(async_op=True).async_wait()
        if req.get("channel_key") == STOP_SERVING:
            break
        if one_at_a_time:
            await serve(req)
        else:
            task = asyncio.get_running_loop().create_task(serve(req))
            pending.add(task)
            task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)


INITIAL_WEIGHT_VERSION = 0  # the weights an engine starts with (no training step behind them)


def next_weight_version(current: int, requested: int | None) -> int:
    """The version a sync gives the engine: the driver's (the training steps behind the weights) or, without one,
    one more than the current."""
    return current + 1 if requested is None else int(requested)


class WeightGate:
    """Admission of generate requests around weight syncs: ``turn()`` admits one request (waiting while a sync holds
    the gate) and gives the version that generates it; ``pause()`` closes the gate and returns once the requests in
    flight have finished; ``resume(version)`` records the new version and opens the gate again."""

    def __init__(self, version: int = INITIAL_WEIGHT_VERSION):
        self.version = version
        self.in_flight = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[int]:
        while not self._open.is_set():
            await self._open.wait()
        self.in_flight += 1
        self._idle.clear()
        try:
            yield self.version
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def pause(self) -> None:
        self._open.clear()
        await self._idle.wait()

    def resume(self, version: int | None = None) -> None:
        """Open the gate; ``version`` None keeps the current one (a sync that broke off)."""
        if version is not None:
            self.version = int(version)
        self._open.set()
