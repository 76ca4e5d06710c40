"""Agent-loop worker of MMSearch-R1: the vision-language loop (``agent/mm_loop.py``) for its share of questions.

Same RLinf protocol as ``SearchR1AgentLoopWorker`` (``init_worker(generate_input_channel, generate_output_channel)``,
``run_agentloop_rollout(input_channel, output_channel)``): each request's ``tasks`` are FVQA questions with their
images; generation goes through the rollout group with every image of the context in each request
(``ChannelGenerator``), image search reads the cache (``tools.image_search``), text search the retrieval server.
One ``SearchRolloutResult`` per question group, carrying the trajectories' images, turn texts and categories.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import ray
from rlinf.scheduler import Worker

from rlinf_ext.agent.mm_loop import MMLoopSettings, MMTools, run_mm_group
from rlinf_ext.agent.mm_prompts import MMPrompts
from rlinf_ext.agent.mm_types import MMTrajectory
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.generation.hf_vl import load_vl_processor
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.protocol.payloads import SearchRolloutRequest, SearchRolloutResult
from rlinf_ext.tools.image_search import ImageSearchTool
from rlinf_ext.tools.search import SearchTool
from rlinf_ext.workers.agent_loop import ChannelGenerator, canonical_order, result_from_group, trajectory_records



def mm_result_from_group(group: list[MMTrajectory], prompt_text: str) -> SearchRolloutResult:
    """``result_from_group`` plus what the VL actor and the mmsearch reward need (images, turn texts, category)."""
    for t in group:  # the text result's search count: both tools
        t.metrics.setdefault("searches", t.metrics.get("image_searches", 0.0) + t.metrics.get("text_searches", 0.0))
        t.metrics.setdefault("search_failures", t.metrics.get("image_search_failures", 0.0)
                             + t.metrics.get("text_search_failures", 0.0))
    result = result_from_group(group, prompt_text)
    result.trajectory_images = [list(t.images) for t in group]
    result.turn_texts = [[turn.text for turn in t.turns] for t in group]
    result.categories = [t.category for t in group]
    return result


def mm_agent_metrics(trajectories: list[MMTrajectory]) -> dict[str, float]:
    """Every counter of the MM loop (``MMTrajectory.metrics``) averaged over the trajectories, as agent/<name>."""
    keys = sorted({k for t in trajectories for k in t.metrics})
    n = max(len(trajectories), 1)
    return {mk.agent_metric(k): sum(float(t.metrics.get(k, 0.0)) for t in trajectories) / n for k in keys}


def mm_trajectory_records(result: SearchRolloutResult) -> list[dict[str, Any]]:
    """``trajectory_records`` plus the image hashes and category of each trajectory (rollout dumps)."""
    records = trajectory_records(result)
    for rec, images, category in zip(records, result.trajectory_images, result.categories):
        rec["image_sha1s"] = [img.sha1 for img in images]
        rec["category"] = category
    return records


class MMSearchAgentLoopWorker(Worker):
    """One agent-loop rank of MMSearch-R1; an async actor (tools and generate replies are awaited)."""

    def __init__(self, cfg: ExperimentConfig, search_server_addr: Any = None, launcher_ip: str | None = None):
        super().__init__()
        self.cfg = cfg
        self.search_server_addr = search_server_addr
        self.launcher_ip = launcher_ip

    async def init_worker(self, generate_input_channel, generate_output_channel) -> None:
        with self.worker_timer():
            cfg = self.cfg
            self.generate_input_channel = generate_input_channel
            self.generate_output_channel = generate_output_channel
            self.processor = load_vl_processor(str(cfg.rollout.model.model_path))
            search_cfg = cfg.tools.search
            if self.search_server_addr is not None:
                search_cfg = dataclasses.replace(search_cfg, server_addr=self.search_server_addr)
            self.text_search = SearchTool(search_cfg, seed=int(cfg.runner.seed) + self._rank,
                                          node_ip=ray.util.get_node_ip_address(), home_ip=self.launcher_ip)
            self.tools = MMTools(ImageSearchTool(cfg.tools.image_search), self.text_search)
            self.settings = MMLoopSettings.from_config(cfg.agentloop)
            self.prompts = MMPrompts.from_config(cfg.agentloop.mmsearch.prompts)
            self.sampling_params = SamplingParams.from_config(cfg.algorithm.sampling_params)

    async def run_agentloop_rollout(self, input_channel, output_channel) -> dict:
        """Roll out every question of one request; returns agent metrics, trajectory records and tool time."""
        with self.worker_timer():
            request: SearchRolloutRequest = await input_channel.get(async_op=True).async_wait()
            if len(request.tasks) != len(request.uids):
                raise ValueError(f"an MMSearch-R1 request needs one task per uid, got {len(request.tasks)} tasks for "
                                 f"{len(request.uids)} uids (is data.type mmsearch?)")
            generator = ChannelGenerator(self.generate_input_channel, self.generate_output_channel, request.seed)
            started, lat_before = time.monotonic(), len(self.text_search.stats.latencies_s)
            decode = self.processor.tokenizer.decode

            async def one(task, uid: str):
                group = await run_mm_group(generator, self.processor, self.tools, task, self.settings, request.n,
                                           prompts=self.prompts, sampling_params=self.sampling_params, uid=uid)
                group = canonical_order(group)
                result = mm_result_from_group(group, decode(group[0].prompt_ids))
                await output_channel.put(result, async_op=True).async_wait()
                return result, group

            done = await asyncio.gather(*(one(t, u) for t, u in zip(request.tasks, request.uids)))
            trajectories = [t for _, group in done for t in group]
            metrics = mm_agent_metrics(trajectories)
            latencies = self.text_search.stats.latencies_s[lat_before:]
            return {"metrics": metrics, "num_trajectories": len(trajectories),
                    "search_calls": int(sum(t.metrics.get("searches", 0.0) for t in trajectories)),
                    "tool_time": float(sum(latencies)), "wall_time": time.monotonic() - started,
                    "trajectories": [rec for res, _ in done for rec in mm_trajectory_records(res)]}
