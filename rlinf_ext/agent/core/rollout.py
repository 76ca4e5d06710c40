"""The contract between the agent-loop worker and an agent (``AgentRollout``): the worker owns the channels and the
timing and knows where it runs (``ToolContext``); the agent builds its tools (``tools/registry.py:build_tools``),
turns one request into prompt groups and one group into a result.
The registry names each agent's implementation (``agent/*/rollout.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from rlinf_ext.agent.core.types import Trajectory
from rlinf_ext.protocol.generation import Generator
from rlinf_ext.protocol.payloads import AgentRolloutRequest, AgentRolloutResult
from rlinf_ext.tools.base import Tool


class AgentRollout(Protocol):
    """Built as ``cls(cfg, context)`` on the agent-loop worker (``cfg``: the experiment config; ``context``: a
    ``tools.base.ToolContext`` for building its tools)."""

    tools: Sequence[Tool]  # the tools it calls (the worker sums their call counters as ``tool_calls``)

    def groups(self, request: AgentRolloutRequest) -> list[tuple[Any, str]]:
        """(task, uid) of every prompt group in the request."""

    async def run_group(
        self, generator: Generator, task: Any, group_size: int, uid: str
    ) -> tuple[AgentRolloutResult, list[Trajectory]]:
        """Roll out one group: its result for the trainer and its trajectories."""

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Agent metrics (``agent/<name>``) averaged over a request's trajectories."""

    def records(self, result: AgentRolloutResult) -> list[dict[str, Any]]:
        """Plain per-trajectory records of a result (rollout dumps)."""
