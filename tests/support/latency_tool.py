"""A plug-in tool with only ``__call__`` (docs/extending.md) that reports the latency its input names: tool time
charged to a request can be checked against hand-computed sums."""

from __future__ import annotations

import asyncio

from rlinf_ext.tools.base import Tool, ToolOutput


class Lookup(Tool):
    name = "lookup"

    async def __call__(self, content: str) -> ToolOutput:
        await asyncio.sleep(0)  # a real await: other tasks run during the call
        return ToolOutput(body="found", latency_s=float(content))
