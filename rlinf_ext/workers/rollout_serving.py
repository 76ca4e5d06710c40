"""The rollout workers' serving loop, shared by every engine (``workers/rollout_hf.py``, ``workers/rollout_vllm.py``).

``serve_requests`` takes ``GenerateRequest`` dicts from the input channel and puts each ``GenerateReply`` under
``key=channel_key`` on the output channel (``protocol/generation.py``), until a ``STOP_SERVING`` request
arrives; a failed request is answered with ``{"error": ...}`` instead of leaving the agent loop waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

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
