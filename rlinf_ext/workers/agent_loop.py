"""Agent-loop worker: runs the Search-R1 loop (``rlinf_ext.agent.loop.run_group``) for its share of prompts.

Protocol of RLinf's ``AgentLoopWorker``: ``init_worker(generate_input_channel, generate_output_channel)``
stores the channels; ``run_agentloop_rollout(input_channel, output_channel)`` takes one ``RolloutRequest``,
generates through the rollout group (``GenerateRequest`` dicts on ``GenerateInput``, ``GenerateReply`` dicts keyed
by ``channel_key`` on ``GenerateOutput``: ``ChannelGenerator``), searches with the search tool, and puts one
``SearchRolloutResult`` per prompt group (``result_from_group``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
import uuid
from typing import Any

import ray
import torch
from rlinf.scheduler import Worker
from transformers import AutoTokenizer

from rlinf_ext.agent.loop import run_group, summarize_metrics
from rlinf_ext.agent.types import Trajectory
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol.generation import GenerateRequest, GenerationResult, SamplingParams, result_of
from rlinf_ext.protocol.payloads import SearchRolloutRequest, SearchRolloutResult
from rlinf_ext.tools.search import SearchTool


def request_seed(step_seed: int, prompt_ids: list[int], occurrence: int) -> int:
    """A sampling seed that depends only on the step, the context and how often it was asked this step."""
    digest = hashlib.blake2b(repr((step_seed, tuple(prompt_ids), occurrence)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


class ChannelGenerator:
    """A ``Generator`` (``protocol/generation.py``) that asks the rollout group over RLinf channels."""

    def __init__(self, input_channel, output_channel, step_seed: int = 0):
        self.input_channel = input_channel
        self.output_channel = output_channel
        self.step_seed = step_seed
        self._seen: dict[tuple[int, ...], int] = {}

    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams,
                       images: list[Any] | None = None) -> GenerationResult:
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
        }
        if images:  # a vision-language context: the engine needs every image so far
            request["images"] = list(images)
        await self.input_channel.put(request, async_op=True).async_wait()
        reply = await self.output_channel.get(channel_key, async_op=True).async_wait()
        return result_of(reply)


def canonical_order(trajectories: list) -> list:
    """Sort a group by content: with per-request seeds the *set* is reproducible, this makes the order too."""
    return sorted(trajectories, key=lambda t: (t.response_ids, t.response_text))


class SearchR1AgentLoopWorker(Worker):
    """One agent-loop rank; an async actor (the search tool and the generate replies are awaited)."""

    def __init__(self, cfg: ExperimentConfig, search_server_addr: Any = None, launcher_ip: str | None = None):
        super().__init__()
        self.cfg = cfg
        self.search_server_addr = search_server_addr
        self.launcher_ip = launcher_ip  # the node where a loopback server address points

    async def init_worker(self, generate_input_channel, generate_output_channel) -> None:
        with self.worker_timer():
            self.generate_input_channel = generate_input_channel
            self.generate_output_channel = generate_output_channel
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.cfg.rollout.model.model_path))
            search_cfg = self.cfg.tools.search
            if self.search_server_addr is not None:  # a server started by the launcher for this run
                search_cfg = dataclasses.replace(search_cfg, server_addr=self.search_server_addr)
            # the node this worker runs on: its own node's server first, never another machine's loopback
            self.search_tool = SearchTool(search_cfg, seed=int(self.cfg.runner.seed) + self._rank,
                                          node_ip=ray.util.get_node_ip_address(), home_ip=self.launcher_ip)
            self.sampling_params = SamplingParams.from_config(self.cfg.algorithm.sampling_params)

    async def run_agentloop_rollout(self, input_channel, output_channel) -> dict:
        """Roll out every prompt of one request; returns agent metrics, trajectories and tool time."""
        with self.worker_timer():
            request: SearchRolloutRequest = await input_channel.get(async_op=True).async_wait()
            generator = ChannelGenerator(self.generate_input_channel, self.generate_output_channel, request.seed)
            calls_before = self.search_tool.stats.calls
            lat_before = len(self.search_tool.stats.latencies_s)
            started = time.monotonic()

            async def one(i: int):
                group = await run_group(
                    generator, self.tokenizer, list(request.input_ids[i]), request.answers[i], self.cfg.agentloop,
                    self.search_tool, request.n, sampling_params=self.sampling_params, uid=request.uids[i],
                )
                result = result_from_group(canonical_order(group), self.tokenizer.decode(request.input_ids[i]))
                await output_channel.put(result, async_op=True).async_wait()
                return result, group

            done = await asyncio.gather(*(one(i) for i in range(len(request.input_ids))))
            trajectories = [t for _, group in done for t in group]
            records = [rec for res, _ in done for rec in trajectory_records(res)]
            metrics = summarize_metrics(trajectories)
            latencies = self.search_tool.stats.latencies_s[lat_before:]
            return {
                "metrics": metrics,
                "num_trajectories": len(trajectories),
                "search_calls": self.search_tool.stats.calls - calls_before,
                "tool_time": float(sum(latencies)),
                "wall_time": time.monotonic() - started,
                "trajectories": records,
            }


def result_from_group(trajectories: list[Trajectory], prompt_text: str | None = None) -> SearchRolloutResult:
    """A group of trajectories (same prompt, same uid) -> one ``SearchRolloutResult``."""
    if not trajectories:
        raise ValueError("result_from_group needs at least one trajectory.")
    n = len(trajectories)
    return SearchRolloutResult(
        num_sequence=n,
        group_size=n,
        prompt_lengths=[len(t.prompt_ids) for t in trajectories],
        prompt_ids=[list(t.prompt_ids) for t in trajectories],
        response_lengths=[len(t.response_ids) for t in trajectories],
        response_ids=[list(t.response_ids) for t in trajectories],
        response_mask=[list(t.response_mask) for t in trajectories],
        is_end=[t.end_reason in ("answer", "eos") for t in trajectories],
        prompt_texts=[prompt_text or ""] * n,
        response_texts=[t.response_text for t in trajectories],
        answers=[t.answers for t in trajectories],
        uid=trajectories[0].uid,
        generated_texts=[t.generated_text for t in trajectories],
        num_searches=[int(t.metrics.get("searches", 0)) for t in trajectories],
        end_reasons=[t.end_reason for t in trajectories],
        trajectory_metrics=[dict(t.metrics) for t in trajectories],
    )


def trajectory_records(result: SearchRolloutResult) -> list[dict[str, Any]]:
    """Plain dicts (JSON-friendly) of a result's trajectories, for ``on_step`` and the rollout dumps."""
    rewards = result.rewards.tolist() if torch.is_tensor(result.rewards) else list(result.rewards or [None] * result.num_sequence)
    return [
        {
            "uid": result.uid,
            "index": i,
            "prompt_text": (result.prompt_texts or [""] * result.num_sequence)[i],
            "response_text": result.response_texts[i],
            "prompt_ids": result.prompt_ids[i],
            "response_ids": result.response_ids[i],
            "response_mask": result.response_mask[i],
            "answers": result.answers[i],
            "reward": rewards[i],
            "end_reason": result.end_reasons[i],
            "metrics": result.trajectory_metrics[i],
        }
        for i in range(result.num_sequence)
    ]
