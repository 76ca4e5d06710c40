"""Thin adapter: the Search-R1 loop (`run_group`) behind RLinf's agent-loop worker interface.

`SearchR1AgentLoopWorker` replaces RLinf's `Searchr1AgentLoopWorker`: generation still goes through the
`GenerateInput`/`GenerateOutput` channels (`AgentLoopWorker.generate`), but with the stop strings in the
request (contract field names) and without cutting/re-encoding; search runs in-process through `SearchTool` (process-wide rate
limit, retries); the `RolloutResult` carries the trajectory-level response mask, rewards and (when the
rollout returns them) logprobs. The rollout side must forward `sampling_params["stop"]` to the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from rlinf_ext.agent.loop import run_group, summarize_metrics
from rlinf_ext.agent.scoring import trajectory_reward_fn
from rlinf_ext.agent.types import GenerationResult, SamplingParams, Trajectory

try:  # RLinf is a dependency, but keep this module importable for the pure helpers if it is broken
    from rlinf.workers.agent.agent_loop import AgentLoopWorker as _AgentLoopWorker
except Exception:  # pragma: no cover - exercised only in a broken environment
    _AgentLoopWorker = object


def engine_sampling_params(params: SamplingParams) -> dict[str, Any]:
    """SamplingParams -> the `sampling_params` dict put on `GenerateInput`: the contract's field names
    (stop strings included); the rollout worker maps them to its engine's names."""
    return dataclasses.asdict(params)


def generation_result_from_engine(
    response: dict, params: SamplingParams, tokenizer: Any, eos_ids: set[int]
) -> GenerationResult:
    """The GenerateOutput dict (`output_ids`, `finish_reason` str or SGLang dict, optional `logprobs`)."""
    ids = list(response["output_ids"])
    text = tokenizer.decode(ids, skip_special_tokens=False)
    reason = response.get("finish_reason")
    if isinstance(reason, dict):
        reason = reason.get("type")
    matched = None
    if ids and ids[-1] in eos_ids:
        finish = "eos"
    else:
        hits = [s for s in params.stop if s in text]
        if hits:
            finish, matched = "stop", min(hits, key=lambda s: text.find(s))
        elif reason == "stop":  # SGLang reports EOS-like stop tokens as "stop"
            finish = "eos"
        else:
            finish = "length"
    return GenerationResult(output_ids=ids, text=text, finish_reason=finish, matched_stop=matched,
                            logprobs=response.get("logprobs"))


class ChannelGenerator:
    """A Generator (docs/contracts.md §2) over `AgentLoopWorker.generate(prompt_ids, sampling_params)`."""

    def __init__(self, generate_fn: Callable[..., Awaitable[dict]], tokenizer: Any, eos_ids: set[int]):
        self.generate_fn, self.tokenizer, self.eos_ids = generate_fn, tokenizer, eos_ids

    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams) -> GenerationResult:
        response = await self.generate_fn(prompt_ids, sampling_params=engine_sampling_params(sampling_params))
        return generation_result_from_engine(response, sampling_params, self.tokenizer, self.eos_ids)


def trajectories_to_rollout_result(trajectories: list[Trajectory], return_logprobs: bool):
    """One group of trajectories -> RLinf `RolloutResult` (trajectory level, with response mask)."""
    import torch
    from rlinf.data.io_struct import RolloutResult

    logprobs = None
    if return_logprobs:
        missing = [t.uid for t in trajectories if t.rollout_logprobs is None]
        if missing:
            raise ValueError("rollout logprobs requested (algorithm.recompute_logprobs=false) but the rollout "
                             "engine returned none; enable rollout.return_logprobs or recompute_logprobs")
        logprobs = [t.rollout_logprobs for t in trajectories]
    return RolloutResult(
        num_sequence=len(trajectories),
        group_size=len(trajectories),
        prompt_lengths=[len(t.prompt_ids) for t in trajectories],
        prompt_ids=[t.prompt_ids for t in trajectories],
        response_lengths=[len(t.response_ids) for t in trajectories],
        response_ids=[t.response_ids for t in trajectories],
        response_texts=[t.response_text for t in trajectories],
        response_mask=[t.response_mask for t in trajectories],
        is_end=[t.end_reason in ("answer", "eos") for t in trajectories],
        answers=[t.answers for t in trajectories],
        # a tensor: RolloutResult.to_actor_batch calls .numel() on it
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
        if all(t.reward is not None for t in trajectories) else None,
        rollout_logprobs=logprobs,
    )


class SearchR1AgentLoopWorker(_AgentLoopWorker):
    """RLinf agent-loop worker running `rlinf_ext.agent.run_group` for each prompt of a RolloutRequest."""

    def __init__(self, cfg: Any, placement: Any):
        super().__init__(cfg, placement)
        self.max_prompt_len = int(cfg.data.max_prompt_length)
        max_response = int(cfg.runner.seq_length) - self.max_prompt_len
        if int(cfg.agentloop.response_length_total) > max_response:
            raise ValueError(
                f"agentloop.response_length_total={cfg.agentloop.response_length_total} exceeds "
                f"runner.seq_length - data.max_prompt_length = {max_response}; lower it or raise seq_length"
            )
        self.sampling_params = SamplingParams.from_config(cfg.algorithm.sampling_params)
        self.reward_fn = trajectory_reward_fn(cfg.reward)
        self.eos_ids = {self.tokenizer.eos_token_id} - {None}
        self._search_tool = None

    @property
    def search_tool(self):
        if self._search_tool is None:  # created in the worker process, next to its event loop
            from rlinf_ext.tools import SearchTool

            self._search_tool = SearchTool(self.cfg.tools.search)
        return self._search_tool

    async def run_agentloop_rollout_group(self, input_ids, answer, group_size, output_channel):
        generator = ChannelGenerator(self.generate, self.tokenizer, self.eos_ids)
        trajectories = await run_group(
            generator, self.tokenizer, list(input_ids)[: self.max_prompt_len], answer, self.cfg.agentloop,
            self.search_tool, group_size, sampling_params=self.sampling_params, reward_fn=self.reward_fn,
        )
        result = trajectories_to_rollout_result(trajectories, self.return_logprobs)
        await output_channel.put(result, async_op=True).async_wait()
        return summarize_metrics(trajectories)

    async def run_agentloop_rollout(self, input_channel, output_channel):
        with self.worker_timer():
            request = input_channel.get()
            per_group = await asyncio.gather(*(
                self.run_agentloop_rollout_group(ids, answer, request.n, output_channel)
                for ids, answer in zip(request.input_ids, request.answers)
            ))
            return mean_metrics(per_group)


def mean_metrics(per_group: list[dict[str, float]]) -> dict[str, float]:
    if not per_group:
        return {}
    return {key: sum(m[key] for m in per_group) / len(per_group) for key in per_group[0]}
