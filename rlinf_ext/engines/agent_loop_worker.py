"""Agent-loop worker: runs the Search-R1 loop (``rlinf_ext.agent.loop.run_group``) for its share of prompts.

Protocol of RLinf's ``AgentLoopWorker``: ``init_worker(generate_input_channel, generate_output_channel)``
stores the channels; ``run_agentloop_rollout(input_channel, output_channel)`` takes one ``RolloutRequest``,
generates through the rollout group (request dicts on ``GenerateInput``, replies keyed by ``channel_key`` on
``GenerateOutput``), searches with the search tool, and puts one result per prompt group.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Any

from rlinf.scheduler import Worker

from rlinf_ext.agent.types import GenerationResult, SamplingParams
from rlinf_ext.engines.payloads import SearchRolloutRequest, result_from_group, trajectory_records


def request_seed(step_seed: int, prompt_ids: list[int], occurrence: int) -> int:
    """A sampling seed that depends only on the step, the context and how often it was asked this step."""
    digest = hashlib.blake2b(repr((step_seed, tuple(prompt_ids), occurrence)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


class ChannelGenerator:
    """A ``Generator`` (contract §2) that asks the rollout group over RLinf channels."""

    def __init__(self, input_channel, output_channel, step_seed: int = 0):
        self.input_channel = input_channel
        self.output_channel = output_channel
        self.step_seed = step_seed
        self._seen: dict[tuple[int, ...], int] = {}

    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams) -> GenerationResult:
        key = tuple(prompt_ids)
        occurrence = self._seen.get(key, 0)
        self._seen[key] = occurrence + 1
        channel_key = uuid.uuid4().hex
        params = {name: getattr(sampling_params, name) for name in SamplingParams.__dataclass_fields__}
        request = {
            "channel_key": channel_key,
            "prompt_ids": list(prompt_ids),
            "sampling_params": params,
            "seed": request_seed(self.step_seed, prompt_ids, occurrence),
        }
        await self.input_channel.put(request, async_op=True).async_wait()
        reply = await self.output_channel.get(channel_key, async_op=True).async_wait()
        if "error" in reply:
            raise RuntimeError(f"rollout engine failed to generate: {reply['error']}")
        return GenerationResult(
            output_ids=reply["output_ids"],
            text=reply.get("text") or "",
            finish_reason=reply["finish_reason"] if reply["finish_reason"] in ("stop", "eos", "length") else "eos",
            matched_stop=reply.get("matched_stop"),
            logprobs=reply.get("logprobs"),
            num_generated=reply.get("num_generated"),
        )


def canonical_order(trajectories: list) -> list:
    """Sort a group by content: with per-request seeds the *set* is reproducible, this makes the order too."""
    return sorted(trajectories, key=lambda t: (t.response_ids, t.response_text))


class SearchR1AgentLoopWorker(Worker):
    """One agent-loop rank; an async actor (the search tool and the generate replies are awaited)."""

    def __init__(self, cfg: Any, search_server_addr: Any = None):
        super().__init__()
        self.cfg = cfg
        self.search_server_addr = search_server_addr

    async def init_worker(self, generate_input_channel, generate_output_channel) -> None:
        with self.worker_timer():
            from transformers import AutoTokenizer

            from rlinf_ext.tools.search import SearchTool

            self.generate_input_channel = generate_input_channel
            self.generate_output_channel = generate_output_channel
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.cfg.rollout.model.model_path))
            search_cfg = self.cfg.tools.search
            if self.search_server_addr is not None:  # a server started by the launcher for this run
                search_cfg = _with_server_addr(search_cfg, self.search_server_addr)
            self.search_tool = SearchTool(search_cfg, seed=int(self.cfg.runner.seed) + self._rank)
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
                group = await _run_group(
                    generator, self.tokenizer, request.input_ids[i], request.answers[i], self.cfg.agentloop,
                    self.search_tool, request.n, self.sampling_params, request.uids[i],
                )
                result = result_from_group(canonical_order(group), self.tokenizer.decode(request.input_ids[i]))
                await output_channel.put(result, async_op=True).async_wait()
                return result, group

            done = await asyncio.gather(*(one(i) for i in range(len(request.input_ids))))
            trajectories = [t for _, group in done for t in group]
            records = [rec for res, _ in done for rec in trajectory_records(res)]
            from rlinf_ext.agent.loop import summarize_metrics

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


async def _run_group(generator, tokenizer, prompt_ids, answers, agent_cfg, search_tool, n, params, uid):
    from rlinf_ext.agent.loop import run_group

    return await run_group(
        generator, tokenizer, list(prompt_ids), answers, agent_cfg, search_tool, n, sampling_params=params, uid=uid
    )


def _with_server_addr(search_cfg: Any, addr: Any) -> Any:
    """A copy of ``tools.search`` pointing at ``addr`` (attribute-access object in, same kind out)."""
    from types import SimpleNamespace

    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(search_cfg):
            copy = OmegaConf.create(OmegaConf.to_container(search_cfg, resolve=True))
            copy.server_addr = addr
            return copy
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    values = dict(vars(search_cfg))
    values["server_addr"] = addr
    return SimpleNamespace(**values)
