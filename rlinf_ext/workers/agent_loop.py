"""The agent-loop worker: runs the configured agent (``protocol/agents.py``) for its share of prompt groups.

Protocol of RLinf's ``AgentLoopWorker``: ``init_worker(generate_input_channel, generate_output_channel)``
stores the channels; ``run_agentloop_rollout(input_channel, output_channel)`` takes one ``RolloutRequest``,
generates through the rollout group (``GenerateRequest`` dicts on ``GenerateInput``, ``GenerateReply`` dicts keyed
by ``channel_key`` on ``GenerateOutput``: ``ChannelGenerator``), lets the agent's rollout
(``agent/core/rollout.py:AgentRollout``) run each group with its tools, and puts one ``AgentRolloutResult`` per
prompt group; the call returns an ``AgentLoopOutput`` (``workers/returns.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Any

import ray
from rlinf.scheduler import Worker

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol.agents import agent_spec
from rlinf_ext.protocol.generation import GenerateRequest, GenerationResult, SamplingParams, result_of
from rlinf_ext.protocol.payloads import AgentRolloutRequest
from rlinf_ext.tools.base import ToolContext
from rlinf_ext.tools.ledger import tool_ledger
from rlinf_ext.workers.returns import AgentLoopOutput, FinishedGroup


def request_seed(step_seed: int, prompt_ids: list[int], occurrence: int) -> int:
    """A sampling seed that depends only on the step, the context and how often it was asked this step."""
    digest = hashlib.blake2b(repr((step_seed, tuple(prompt_ids), occurrence)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def calls_of(trajectory: Any, tools) -> float:
    """Tool calls one trajectory made, over every tool (``Tool.metric_names().calls``)."""
    return sum(trajectory.metrics.get(tool.metric_names().calls, 0.0) for tool in tools)


class ChannelGenerator:
    """A ``Generator`` (``protocol/generation.py``) that asks the rollout group over RLinf channels; each result
    carries the weight version the rollout stamped on its reply (``result_of``). Every request carries
    ``priority``, its batch's dispatch index, so the engines serve the batch a step needs next first."""

    def __init__(self, input_channel, output_channel, step_seed: int = 0, priority: int = 0):
        self.input_channel = input_channel
        self.output_channel = output_channel
        self.step_seed = step_seed
        self.priority = priority
        self._seen: dict[tuple[int, ...], int] = {}

    async def generate(
        self, prompt_ids: list[int], sampling_params: SamplingParams, images: list[Any] | None = None
    ) -> GenerationResult:
        key = tuple(prompt_ids)
        occurrence = self._seen.get(key, 0)
        self._seen[key] = occurrence + 1
        channel_key = uuid.uuid4().hex
        params = {name: getattr(sampling_params, name) for name in SamplingParams.__dataclass_fields__}
        request: GenerateRequest = {
            "channel_key": channel_key,
            "prompt_ids": list(prompt_ids),
            "sampling_params": params,
            "seed": request_seed(self.step_seed, prompt_ids, occurrence),
            "priority": self.priority,
        }
        if images:  # a vision-language context: the engine needs every image so far
            request["images"] = list(images)
        await self.input_channel.put(request, async_op=True).async_wait()
        reply = await self.output_channel.get(channel_key, async_op=True).async_wait()
        return result_of(reply)


class AgentLoopWorker(Worker):
    """One agent-loop rank; an async actor (the tools and the generate replies are awaited)."""

    def __init__(self, cfg: ExperimentConfig, search_server_addr: Any = None, launcher_ip: str | None = None):
        super().__init__()
        self.cfg = cfg
        self.search_server_addr = search_server_addr
        self.launcher_ip = launcher_ip  # the node where a loopback server address points

    async def init_worker(self, generate_input_channel, generate_output_channel) -> None:
        with self.worker_timer():
            self.generate_input_channel = generate_input_channel
            self.generate_output_channel = generate_output_channel
            # the node this worker runs on: its own node's server first, never another machine's loopback
            context = ToolContext(
                seed=int(self.cfg.runner.seed) + self._rank,
                node_ip=ray.util.get_node_ip_address(),
                launcher_ip=self.launcher_ip,
                search_server_addr=self.search_server_addr,
            )
            self.agent = agent_spec(self.cfg).load("rollout")(self.cfg, context)

    async def run_agentloop_rollout(self, input_channel, output_channel) -> AgentLoopOutput:
        """Roll out every prompt group of one request; returns this rank's records, agent metrics and times."""
        with self.worker_timer():
            request: AgentRolloutRequest = await input_channel.get(async_op=True).async_wait()
            generator = ChannelGenerator(
                self.generate_input_channel, self.generate_output_channel, request.seed, request.priority
            )
            started = time.monotonic()

            by_group = self.cfg.runner.admission == "group"  # each group goes out with its own records and times

            async def one(task, uid: str):
                # a ledger per group: this group's tool calls (the batches in flight beside it have their own)
                with tool_ledger() as own:
                    result, group = await self.agent.run_group(generator, task, request.n, uid)
                if by_group:
                    output = AgentLoopOutput(
                        trajectories=self.agent.records(result),
                        metrics=self.agent.metrics(group),
                        num_trajectories=len(group),
                        tool_calls=int(sum(calls_of(t, self.agent.tools) for t in group)),
                        tool_time=own.seconds,
                        wall_time=time.monotonic() - started,
                    )
                    await output_channel.put(FinishedGroup(result, output), async_op=True).async_wait()
                else:
                    await output_channel.put(result, async_op=True).async_wait()
                return result, group, own.seconds

            done = await asyncio.gather(*(one(task, uid) for task, uid in self.agent.groups(request)))
            trajectories = [t for _, group, _ in done for t in group]
            return AgentLoopOutput(
                trajectories=[rec for res, _, _ in done for rec in self.agent.records(res)],
                metrics=self.agent.metrics(trajectories),
                num_trajectories=len(trajectories),
                tool_calls=int(sum(calls_of(t, self.agent.tools) for t in trajectories)),
                tool_time=sum(seconds for _, _, seconds in done),
                wall_time=time.monotonic() - started,
            )
