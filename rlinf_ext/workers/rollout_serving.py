"""The rollout workers' serving loop, shared by every engine (``workers/rollout_hf.py``, ``workers/rollout_vllm.py``,
``workers/rollout_sglang.py``), and the weight versions they stamp on replies.

``serve_requests`` answers each ``GenerateRequest`` with a ``GenerateReply`` under its ``channel_key`` until
``STOP_SERVING``; a failed request gets ``{"error": ...}`` so the agent loop never waits forever. Ray runs
``sync_model_from_actor`` between the loop's awaits, so a sync can land mid-generation: ``WeightGate`` is the wait-mode
pause for engines without one (HF, SGLang's worker): stop admitting, wait for those in flight, load, admit again, so
each reply has one version. The wait is bounded by ``sync/engine_calls.py:SYNC_TIMEOUT_S`` (a hung generate would
stall the run silently); ``InFlight`` keeps the requests' channel keys so the timeout names them."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from rlinf_ext.protocol.generation import STOP_SERVING, GenerateReply, GenerateRequest
from rlinf_ext.sync.engine_calls import SYNC_TIMEOUT_S, wait_async


async def serve_requests(
    input_channel,
    output_channel,
    generate: Callable[[GenerateRequest], Awaitable[GenerateReply]],
    *,
    one_at_a_time: bool = False,
) -> None:
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


class InFlight:
    """The generate requests being served, by channel key (the agent loop's uid for the turn)."""

    SHOWN = 8  # keys named in an error; the count covers the rest

    def __init__(self):
        self.keys: Counter[str] = Counter()

    def __len__(self) -> int:
        return self.keys.total()

    @contextlib.contextmanager
    def track(self, key: str) -> Iterator[None]:
        self.keys[key] += 1
        try:
            yield
        finally:
            self.keys[key] -= 1
            if not self.keys[key]:
                del self.keys[key]

    def describe(self) -> str:
        if not self.keys:
            return "no generate request was in flight (the engine itself is stuck)"
        keys = sorted(self.keys)
        more = f" and {len(keys) - self.SHOWN} more" if len(keys) > self.SHOWN else ""
        named = ", ".join(keys[: self.SHOWN])
        return (
            f"{len(self)} generate request(s) still in flight, channel key(s) {named}{more}: a hung generate "
            "(see that engine's log)"
        )


async def timed_pause(pause: Awaitable, engine: str, requests: InFlight, timeout_s: float = SYNC_TIMEOUT_S) -> None:
    """``pause`` (a sync's wait for ``requests`` to finish), given up after ``timeout_s`` with a ``WeightSyncError``
    naming ``engine`` and the requests still in flight then."""
    await wait_async(pause, timeout_s, f"{engine}: the weight sync's pause", stuck=requests.describe)


class WeightGate:
    """Admission of generate requests around weight syncs: ``turn(key)`` admits the request of channel key ``key``
    (waiting while a sync holds the gate) and gives the version that generates it; ``pause(engine)`` closes the gate
    and returns once the requests in flight have finished (``timed_pause``: the gate stays closed after a timeout,
    the sync's ``resume`` reopens it); ``resume(version)`` records the new version and opens the gate again."""

    def __init__(self, version: int = INITIAL_WEIGHT_VERSION):
        self.version = version
        self.requests = InFlight()
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    @property
    def in_flight(self) -> int:
        return len(self.requests)

    @contextlib.asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[int]:
        while not self._open.is_set():
            await self._open.wait()
        self._idle.clear()
        try:
            with self.requests.track(key):
                yield self.version
        finally:
            if not self.requests:
                self._idle.set()

    async def pause(self, engine: str, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """``engine``: who pauses, for the timeout's error (e.g. "HF rollout rank 0")."""
        self._open.clear()
        await timed_pause(self._idle.wait(), engine, self.requests, timeout_s)

    def resume(self, version: int | None = None) -> None:
        """Open the gate; ``version`` None keeps the current one (a sync that broke off)."""
        if version is not None:
            self.version = int(version)
        self._open.set()
