"""Control calls from actor rank 0 to every rollout engine over RLinf, for the GPU weight routes that go through an
engine's own API (``sync/vllm_transfer.py``: vLLM's weight-transfer engines; ``sync/sglang_transfer.py``: SGLang's
``update_weights_from_distributed``). Engine-neutral: the call names belong to each route.

The actor sends an ``EngineCall`` to every rollout rank, the rollout worker hands it to its engine
(``serve_engine_calls``) and answers with an ``EngineReply``. A call may be sent, then met by a transfer that the
engine's call waits on (an NCCL broadcast), then answered: ``EngineCallClient.send`` and ``collect`` are apart.
Every wait is bounded (NCCL waits have no timeout of their own): a timeout raises ``WeightSyncError`` naming the step.
``SYNC_TIMEOUT_S`` bounds the waits of every route: the rollout workers' async waits (an engine call here, a sync's
pause for the requests in flight in ``workers/rollout_serving.py``, SGLang's flush) go through ``wait_async``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rlinf_ext.config.placement import PlacementError, component_ranks, placement_mode
from rlinf_ext.protocol.engines import engine_spec
from rlinf_ext.sync.weight_sync import SYNC_END, SyncHeader, SyncRoutes, WeightSyncError

SYNC_TIMEOUT_S = 600.0  # one whole transfer (rendezvous, wake-up, every bucket) or one control call


@dataclass
class EngineCall:
    """One control call for the rollout's engine: ``payload`` is the call's argument (init info, update info...)."""

    method: str
    payload: Any = None


@dataclass
class EngineReply:
    method: str
    error: str | None = None


# ------------------------------------------------------------------------------------------------ choices (pure)
def gpu_route(cfg: Any, cuda: bool) -> str | None:
    """The weight-sync route of this run's engine on GPUs (``EngineSpec.route`` of where it sits against the actor:
    ``config/placement.py:placement_mode``); None off GPUs, or without an actor (evaluation: no weights arrive)."""
    if not cuda:
        return None
    try:
        placed = component_ranks(cfg.cluster.component_placement, cfg.cluster.num_nodes * cfg.cluster.num_gpus_per_node)
        mode = placement_mode(cfg)
    except PlacementError:
        return None  # validate reports the placement
    return engine_spec(cfg).route(collocated=mode == "collocated") if "actor" in placed else None


def nccl_world_size(routes: SyncRoutes) -> int:
    """Actor rank 0 plus every GPU of every engine."""
    return 1 + routes.rollout_dp * routes.rollout_tp


def engine_init_info(init_info: dict[str, Any], rollout_rank: int, rollout_tp: int) -> dict[str, Any]:
    """The init info one engine gets (pure): the actor is rank 0, and each engine numbers its TP workers from
    0 and adds its ``rank_offset`` (vLLM's NCCL worker engine and SGLang's ``init_weights_update_group`` alike), so
    engine ``e`` starts at ``rank_offset + e x TP`` (``rank_offset`` = 1 for engine 0)."""
    if "rank_offset" not in init_info:
        return dict(init_info)
    return {**init_info, "rank_offset": int(init_info["rank_offset"]) + rollout_rank * rollout_tp}


def nccl_rendezvous() -> tuple[str, int]:
    """Actor rank 0's address (RLinf's ``MASTER_ADDR`` of the actor group, else this host) and a free port."""
    host = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return host, int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------------ waits
def wait_work(work: Any, timeout_s: float, what: str) -> Any:
    """``work.wait()`` of an RLinf ``AsyncWork``, polled so it gives up after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not work.done():
        if time.monotonic() > deadline:
            raise WeightSyncError(
                f"{what} did not complete within {timeout_s:g} s; the other side is gone or stuck "
                "(check the rollout workers' logs)."
            )
        time.sleep(0.002)
    return work.wait()


async def wait_async(awaitable: Awaitable, timeout_s: float, what: str, stuck: Callable[[], str] | None = None) -> Any:
    """``await awaitable`` in an async worker, cancelled after ``timeout_s``: the timeout raises ``WeightSyncError``
    naming ``what`` and, with ``stuck``, what was still awaited at that moment (read then, not before)."""
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            return await awaitable
    except TimeoutError:
        if not deadline.expired():
            raise  # the awaited call's own timeout, not this wait's
        detail = f": {stuck()}" if stuck is not None else ""
        raise WeightSyncError(f"{what} did not finish within {timeout_s:g} s{detail}") from None


def run_with_timeout(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``fn()`` in a daemon thread, waited at most ``timeout_s``: NCCL rendezvous, broadcasts and stream
    synchronisation block without a timeout. The thread runs on the caller's CUDA device (a new thread's current
    device is 0, and vLLM's trainer engines read it: the IPC buffer's device and GPU UUID, the NCCL group's device).
    On timeout the thread is left behind (a blocked NCCL call cannot be cancelled) and the transfer group is
    unusable: restart the run."""
    box: dict[str, Any] = {}
    device = current_cuda_device()

    def target():
        try:
            if device is not None:
                import torch  # lazy: only with CUDA (current_cuda_device)

                torch.cuda.set_device(device)
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"rlinf-ext {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise WeightSyncError(
            f"{what} did not finish within {timeout_s:g} s (an engine did not join the transfer, "
            "or the NCCL group hangs); restart the run and check the rollout workers' logs."
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")


def current_cuda_device() -> int | None:
    """This thread's current CUDA device; None without CUDA."""
    import torch  # lazy: the CPU routes and the CLI never need it here

    return torch.cuda.current_device() if torch.cuda.is_available() else None


# ------------------------------------------------------------------------------------------------ actor side
class EngineCallClient:
    """Actor rank 0's end: ``call`` sends one ``EngineCall`` per rollout rank and returns once every rank has
    answered (the ranks' errors raised together); ``send`` and ``collect`` are its two halves, for a call that a
    transfer must meet in between. Also sends the plain messages of a sync (header, ``SYNC_END``)."""

    engine_name = "the engine"

    def __init__(self, worker: Any, rollout_group: str, routes: SyncRoutes, timeout_s: float = SYNC_TIMEOUT_S):
        self.worker, self.rollout_group, self.routes, self.timeout_s = worker, rollout_group, routes, timeout_s

    def to_every_rollout_rank(self, messages: Iterable[Any], what: str) -> None:
        for rank, message in zip(range(self.routes.rollout_dp), messages, strict=True):
            wait_work(
                self.worker.send(message, self.rollout_group, rank, async_op=True),
                self.timeout_s,
                f"sending {what} to rollout rank {rank}",
            )

    def send(self, method: str, payloads: list[Any]) -> None:
        self.to_every_rollout_rank([EngineCall(method, p) for p in payloads], method)

    def collect(self, method: str) -> None:
        errors = []
        for rank in range(self.routes.rollout_dp):
            reply = wait_work(
                self.worker.recv(self.rollout_group, rank, async_op=True),
                self.timeout_s,
                f"rollout rank {rank}'s answer to {method}",
            )
            if not isinstance(reply, EngineReply) or reply.method != method:
                raise WeightSyncError(f"rollout rank {rank} answered {method} with {reply!r}")
            if reply.error:
                errors.append(f"rank {rank}: {reply.error}")
        if errors:
            raise WeightSyncError(f"{self.engine_name} refused {method}: " + "; ".join(errors))

    def _call(self, method: str, payloads: list[Any]) -> None:
        self.send(method, payloads)
        self.collect(method)


# ------------------------------------------------------------------------------------------------ rollout side
async def serve_engine_calls(
    worker: Any,
    handle: Callable[[EngineCall], Any],
    *,
    actor_group: str,
    methods: tuple[str, ...],
    timeout_s: float = SYNC_TIMEOUT_S,
) -> SyncHeader:
    """Rollout side (an async RLinf worker): the header from actor rank 0, then every ``EngineCall`` (one of
    ``methods``) handed to ``handle`` (the engine side) and answered with an ``EngineReply`` until ``SYNC_END``. A
    failed call is answered with its error (the actor raises it) and raised here after the answer; an engine call
    that does not finish within ``timeout_s`` fails the same way."""

    async def recv():
        return await worker.recv(actor_group, 0, async_op=True).async_wait()

    header = await recv()
    if not isinstance(header, SyncHeader):
        raise WeightSyncError(f"the actor began a weight transfer with {header!r} instead of a SyncHeader")
    while (message := await recv()) != SYNC_END:
        if not isinstance(message, EngineCall) or message.method not in methods:
            raise WeightSyncError(f"unexpected message during a weight transfer: {message!r} (expected {methods})")
        error: BaseException | None = None
        try:
            await wait_async(handle(message), timeout_s, f"rollout rank {worker._rank}: the engine's {message.method}")
        except Exception as exc:  # answered first: the actor must not wait for a reply that never comes
            error = exc
        await worker.send(
            EngineReply(message.method, None if error is None else f"{type(error).__name__}: {error}"),
            actor_group,
            0,
            async_op=True,
        ).async_wait()
        if error is not None:
            raise error
    return header
