"""MMSearch-R1 behind the agent-loop worker (``agent/core/rollout.py:AgentRollout``): one FVQA question (with its
images) per group, the vision-language loop with the image-search cache and the text search, and the shared result
plus what the VL actor and the mmsearch reward need (images, turn texts, category), and each trajectory's
retokenisation check against the actor's processor (``retokenize.py``)."""

from __future__ import annotations

from typing import Any

from rlinf_ext.agent.core.results import canonical_order, result_from_group, trajectory_records
from rlinf_ext.agent.mmsearch.loop import LoopSettings, SearchTools, run_group
from rlinf_ext.agent.mmsearch.prompts import Prompts
from rlinf_ext.agent.mmsearch.retokenize import mark_retokenize_mismatches
from rlinf_ext.agent.mmsearch.types import VLTrajectory
from rlinf_ext.generation.hf_vl import load_vl_processor
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.generation import Generator, SamplingParams
from rlinf_ext.protocol.payloads import AgentRolloutRequest, AgentRolloutResult
from rlinf_ext.tools.base import ToolContext
from rlinf_ext.tools.registry import IMAGE_SEARCH, SEARCH, build_tools


def group_result(group: list[VLTrajectory], prompt_text: str) -> AgentRolloutResult:
    """``result_from_group`` plus the trajectories' images, turn texts and category."""
    for t in group:  # the shared result's search count: both tools
        t.metrics.setdefault("searches", t.metrics.get("image_searches", 0.0) + t.metrics.get("text_searches", 0.0))
        t.metrics.setdefault(
            "search_failures", t.metrics.get("image_search_failures", 0.0) + t.metrics.get("text_search_failures", 0.0)
        )
    result = result_from_group(group, prompt_text)
    result.trajectory_images = [list(t.images) for t in group]
    result.turn_texts = [[turn.text for turn in t.turns] for t in group]
    result.categories = [t.category for t in group]
    return result


def agent_metrics(trajectories: list[VLTrajectory]) -> dict[str, float]:
    """Every counter of the MM loop (``VLTrajectory.metrics``) averaged over the trajectories, as agent/<name>."""
    keys = sorted({k for t in trajectories for k in t.metrics})
    n = max(len(trajectories), 1)
    return {mk.agent_metric(k): sum(float(t.metrics.get(k, 0.0)) for t in trajectories) / n for k in keys}


def result_records(result: AgentRolloutResult) -> list[dict[str, Any]]:
    """``trajectory_records`` plus the image hashes and category of each trajectory."""
    records = trajectory_records(result)
    for rec, images, category in zip(records, result.trajectory_images, result.categories):
        rec["image_sha1s"] = [img.sha1 for img in images]
        rec["category"] = category
    return records


class MMSearchRollout:
    def __init__(self, cfg: Any, context: ToolContext):
        self.processor = load_vl_processor(str(cfg.rollout.model.model_path))
        # built one by one: the image search's <search> tag is the text tool's in Search-R1 (here <text_search>)
        (image_search,), (text_search,) = build_tools([IMAGE_SEARCH], cfg, context), build_tools([SEARCH], cfg, context)
        self.tools = [text_search]  # its `searches` counter holds both tools' calls (group_result)
        self.search_tools = SearchTools(image_search, text_search)
        self.settings = LoopSettings.from_config(cfg.agentloop)
        self.prompts = Prompts.from_config(cfg.agentloop.mmsearch.prompts)
        self.sampling_params = SamplingParams.from_config(cfg.algorithm.sampling_params)

    def groups(self, request: AgentRolloutRequest) -> list[tuple[Any, str]]:
        if len(request.tasks) != len(request.uids):
            raise ValueError(
                f"an MMSearch-R1 request needs one task per uid, got {len(request.tasks)} tasks for "
                f"{len(request.uids)} uids (is data.type mmsearch?)"
            )
        return list(zip(request.tasks, request.uids))

    async def run_group(
        self, generator: Generator, task: Any, group_size: int, uid: str
    ) -> tuple[AgentRolloutResult, list[VLTrajectory]]:
        group = await run_group(
            generator,
            self.processor,
            self.search_tools,
            task,
            self.settings,
            group_size,
            prompts=self.prompts,
            sampling_params=self.sampling_params,
            uid=uid,
        )
        group = canonical_order(group)
        mark_retokenize_mismatches(self.processor, group)  # training only: agent/retokenize_mismatch per step
        return group_result(group, self.processor.tokenizer.decode(group[0].prompt_ids)), group

    def metrics(self, trajectories: list[VLTrajectory]) -> dict[str, float]:
        return agent_metrics(trajectories)

    def records(self, result: AgentRolloutResult) -> list[dict[str, Any]]:
        return result_records(result)
