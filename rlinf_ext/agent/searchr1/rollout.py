"""Search-R1 behind the agent-loop worker (``agent/core/rollout.py:AgentRollout``): its tools (``agentloop.searchr1.tools``),
one prompt of the request's tokenised prompts per group, the text loop, the shared result."""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer

from rlinf_ext.agent.core.results import canonical_order, result_from_group, trajectory_records
from rlinf_ext.agent.core.types import Trajectory
from rlinf_ext.agent.searchr1.config import LoopSettings
from rlinf_ext.agent.searchr1.loop import run_group, summarize_metrics
from rlinf_ext.protocol.generation import Generator, SamplingParams
from rlinf_ext.protocol.payloads import AgentRolloutRequest, AgentRolloutResult
from rlinf_ext.tools.base import ToolContext
from rlinf_ext.tools.registry import build_agent_tools


class SearchR1Rollout:
    def __init__(self, cfg: Any, context: ToolContext):
        self.cfg = cfg
        self.loop_cfg = LoopSettings.from_config(cfg)
        self.tools = build_agent_tools(cfg, context)
        self.tokenizer = AutoTokenizer.from_pretrained(str(cfg.rollout.model.model_path))
        self.sampling_params = SamplingParams.from_config(cfg.algorithm.sampling_params)

    def groups(self, request: AgentRolloutRequest) -> list[tuple[Any, str]]:
        return [
            ((list(ids), answers), uid) for ids, answers, uid in zip(request.input_ids, request.answers, request.uids)
        ]

    async def run_group(
        self, generator: Generator, task: Any, group_size: int, uid: str
    ) -> tuple[AgentRolloutResult, list[Trajectory]]:
        prompt_ids, answers = task
        group = await run_group(
            generator,
            self.tokenizer,
            prompt_ids,
            answers,
            self.loop_cfg,
            self.tools,
            group_size,
            sampling_params=self.sampling_params,
            uid=uid,
        )
        group = canonical_order(group)
        return result_from_group(group, self.tokenizer.decode(prompt_ids)), group

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        return summarize_metrics(trajectories, self.tools)

    def records(self, result: AgentRolloutResult) -> list[dict[str, Any]]:
        return trajectory_records(result)
