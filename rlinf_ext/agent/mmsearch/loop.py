"""The MMSearch-R1 multi-turn rollout as a pure async function of (generator, processor, tools, settings).

Per turn: generate with the engine's stops (`</search>`, `</text_search>`, `</answer>`, EOS) over the whole
context and every image so far; parse the action at the end of the turn; run the image search (by the task's
`data_id`) or the text search; append the observation as the next user turn (mask 0, thumbnails' pads
expanded). A search past its limit, or asked in the last round, ends the trajectory (MMSearch-R1's rule), as
does an answer, EOS or anything else. `response_length_total` bounds everything after the first prompt,
observation ids and expanded pads included.

INVARIANTS (`check_invariants`, on every trajectory): (1) response ids are the turns' sampled ids (mask 1)
and observation ids (mask 0), concatenated; (2) the `<|image_pad|>` ids of prompt + response are exactly the
images' token counts, in order; (3) no vision special id and no id >= len(tokenizer) has mask 1; (4) one
`<|vision_start|>` per image.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlinf_ext.agent.core.response import ResponseBuffer, check_mask_invariant
from rlinf_ext.agent.mmsearch.config import MMSearchConfig
from rlinf_ext.agent.mmsearch.observation import (
    Observation,
    build_observation,
    failure_body,
    text_results_body,
)
from rlinf_ext.agent.mmsearch.prompts import Prompts
from rlinf_ext.agent.mmsearch.protocol import parse_action, with_stops
from rlinf_ext.agent.mmsearch.types import TOOL_IMAGE, TOOL_TEXT, Task, VLTrajectory, VLTurnRecord
from rlinf_ext.config.schema import AgentLoopConfig
from rlinf_ext.protocol.generation import GenerationResult, Generator, SamplingParams, WeightVersion
from rlinf_ext.protocol.images import image_pad_count
from rlinf_ext.protocol.vl_tokens import IMAGE_PAD, VISION_START, token_id, vision_special_ids


@dataclass(frozen=True)
class LoopSettings:
    """The loop's knobs; their defaults live only in the schema (``with_defaults``)."""

    max_gen_round: int
    image_search_limit: int
    text_search_limit: int
    response_length_total: int
    max_obs_length: int
    print_outputs: bool = False

    @classmethod
    def with_defaults(cls, **overrides: Any) -> "LoopSettings":
        """The schema's `agentloop` defaults with `overrides`."""
        return dataclasses.replace(cls.from_sections(AgentLoopConfig(), MMSearchConfig()), **overrides)

    @classmethod
    def from_config(cls, agentloop: Any) -> "LoopSettings":
        """From the `agentloop` section (its mounted `mmsearch` section holds the agent's own knobs)."""
        return cls.from_sections(agentloop, agentloop.mmsearch)

    @classmethod
    def from_sections(cls, agentloop: Any, mm: Any) -> "LoopSettings":
        out = cls(
            int(mm.max_gen_round),
            int(mm.image_search_limit),
            int(mm.text_search_limit),
            int(agentloop.response_length_total),
            int(agentloop.max_obs_length),
            bool(agentloop.print_outputs),
        )
        if out.max_gen_round < 1:
            raise ValueError(f"agentloop.mmsearch.max_gen_round must be >= 1, got {out.max_gen_round}")
        if min(out.image_search_limit, out.text_search_limit) < 0:
            raise ValueError("agentloop.mmsearch.image_search_limit / text_search_limit must be >= 0")
        return out


@dataclass
class SearchTools:
    image_search: Any  # tools.image_search.ImageSearch: a Tool, run(data_id) -> ImageSearchOutput
    text_search: Any  # tools.search.TextSearch (or its client, SearchTool): async search(query) -> SearchResult


def first_prompt_ids(processor: Any, prompts: Prompts, task: Task) -> list[int]:
    """The chat template over [instruction, the question's images, the question]; pads expanded by the processor."""
    content = (
        [{"type": "text", "text": prompts.round_1}]
        + [{"type": "image"} for _ in task.images]
        + [{"type": "text", "text": task.question}]
    )
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    images = [ref.to_pil() for ref in task.images] or None
    return processor(text=[text], images=images, return_tensors="pt").input_ids[0].tolist()


def check_invariants(trajectory: VLTrajectory, processor: Any) -> None:
    """Raise AssertionError naming the broken invariant (module docstring, 1-4)."""
    check_mask_invariant(trajectory)
    tok = processor.tokenizer
    ids = trajectory.prompt_ids + trajectory.response_ids
    pad = token_id(tok, IMAGE_PAD)
    expected = sum(image_pad_count(processor.image_processor, ref) for ref in trajectory.images)
    if ids.count(pad) != expected:
        raise AssertionError(f"image-pad invariant broken: {ids.count(pad)} pads for images needing {expected}")
    banned = vision_special_ids(tok)
    bad = [t for t, m in zip(trajectory.response_ids, trajectory.response_mask) if m and (t in banned or t >= len(tok))]
    if bad:
        raise AssertionError(f"banned-id invariant broken: ids {sorted(set(bad))} are kept with mask 1")
    starts = ids.count(token_id(tok, VISION_START))
    if starts != len(trajectory.images):
        raise AssertionError(
            f"image-count invariant broken: {starts} <|vision_start|> for {len(trajectory.images)} images"
        )


def _drop_banned(result: GenerationResult, tokenizer: Any, banned: set[int]) -> tuple[GenerationResult, int]:
    """Remove banned ids an engine returned anyway (the turn is then judged on the remaining text)."""
    keep = [i for i, t in enumerate(result.output_ids) if t not in banned and t < len(tokenizer)]
    dropped = len(result.output_ids) - len(keep)
    if not dropped:
        return result, 0
    ids = [result.output_ids[i] for i in keep]
    logprobs = None if result.logprobs is None else [result.logprobs[i] for i in keep]
    version = result.weight_version
    if isinstance(version, list):  # one per id (a turn a sync passed): the kept ids keep theirs
        version = [version[i] for i in keep]
    return GenerationResult(
        ids, tokenizer.decode(ids), "length", result.matched_stop, logprobs, result.generated_tokens, version
    ), dropped


class _Run(ResponseBuffer):
    """The mutable state of one trajectory (ids, mask, counters) and its turn steps."""

    def __init__(self, generator, processor, tools, task, settings, prompts, prompt_ids):
        super().__init__()
        self.g, self.p, self.tools, self.task, self.s, self.prompts = (
            generator,
            processor,
            tools,
            task,
            settings,
            prompts,
        )
        self.prompt_ids = prompt_ids
        self.images = list(task.images)
        self.turns: list[VLTurnRecord] = []
        names = tools.image_search.metric_names()
        self.counts = {names.calls: 0, names.failures: 0, names.latency_s: 0.0}
        self.counts.update(
            text_searches=0,
            text_search_failures=0,
            missing_images=0,
            search_limit_hits=0,
            generated_tokens=0,
            image_pad_tokens=0,
            truncated_observations=0,
            banned_dropped=0,
        )
        self.banned = vision_special_ids(processor.tokenizer)

    def limit_reached(self, action: str, turn_index: int) -> bool:
        image = action == "image_search"
        used = self.counts[self.tools.image_search.metric_names().calls if image else "text_searches"]
        limit = self.s.image_search_limit if image else self.s.text_search_limit
        return used >= limit or turn_index >= self.s.max_gen_round - 1

    async def observe(self, action: str, query: str | None, record: VLTurnRecord) -> Observation:
        after_im_end = bool(record.response_ids) and record.response_ids[-1] == self.p.tokenizer.convert_tokens_to_ids(
            "<|im_end|>"
        )
        if action == "image_search":
            tool = self.tools.image_search
            names = tool.metric_names()
            found = await tool.run(self.task.data_id)  # the task's image is the query: the call carries only <img>
            self.counts[names.calls] += 1
            self.counts[names.failures] += 0 if found.ok else 1
            self.counts[names.latency_s] += float(found.latency_s or 0.0)
            record.tool, record.tool_ok, record.titles = TOOL_IMAGE, found.ok, [h.title for h in found.hits]
            self.counts["missing_images"] += found.missing_images
            if found.ok:
                body, images = self.prompts.image_results_header + found.body, list(found.images)
            else:
                body, images = failure_body(self.prompts, found.error or "no results"), []
            return build_observation(
                self.p, self.prompts, body, images, self.task.question, self.prompts.after_image_search, after_im_end
            )
        self.counts["text_searches"] += 1
        found = await self.tools.text_search.search(query)
        record.tool, record.tool_ok, record.titles = TOOL_TEXT, found.ok, [d.title for d in found.documents]
        truncated = False
        if found.ok:
            body, truncated = text_results_body(self.p.tokenizer, self.prompts, found.documents, self.s.max_obs_length)
        else:
            self.counts["text_search_failures"] += 1
            body = failure_body(self.prompts, found.error or "no results")
        self.counts["truncated_observations"] += int(truncated)
        return build_observation(
            self.p, self.prompts, body, [], self.task.question, self.prompts.after_text_search, after_im_end, truncated
        )

    def append(
        self, sampled: list[int], logprobs: list[float] | None, version: WeightVersion, obs: Observation | None
    ) -> None:
        self.add_sampled(sampled, logprobs, version)
        if obs is not None:
            self.add_observation(obs.ids)
            self.images += obs.images
            self.counts["image_pad_tokens"] += obs.image_tokens


async def _turn(run: _Run, base: SamplingParams, turn_index: int) -> str:
    """One generation turn and its tool call; returns the end reason ('' to continue)."""
    remaining = run.s.response_length_total - len(run.response_ids)
    if remaining <= 0:
        return "response_budget"
    params = base.with_updates(max_new_tokens=min(base.max_new_tokens, remaining), stop=with_stops(base.stop))
    context = run.prompt_ids + run.response_ids
    result = await run.g.generate(context, params, images=list(run.images))
    if len(result.output_ids) > params.max_new_tokens:
        raise RuntimeError(
            f"generator returned {len(result.output_ids)} ids for max_new_tokens={params.max_new_tokens}"
        )
    run.counts["generated_tokens"] += result.generated_tokens
    result, dropped = _drop_banned(result, run.p.tokenizer, run.banned)
    run.counts["banned_dropped"] += dropped
    action, content = parse_action(result.text, result.finish_reason)
    if dropped:
        action, content = "invalid", None
    record = VLTurnRecord(
        prompt_ids=context,
        response_ids=list(result.output_ids),
        observation_ids=[],
        text=result.text,
        action=action,
        finish_reason=result.finish_reason,
        matched_stop=result.matched_stop,
        query=content if action == "text_search" else None,
        logprobs=None if result.logprobs is None else list(result.logprobs),
        generated_tokens=result.generated_tokens,
        weight_version=result.weight_version,
        banned_dropped=dropped,
    )
    end, obs = "", None
    if action in ("image_search", "text_search") and run.limit_reached(action, turn_index):
        record.action, end = "search_limit", "search_limit"
        run.counts["search_limit_hits"] += 1
    elif action in ("image_search", "text_search"):
        obs = await run.observe(action, content, record)
        if len(run.response_ids) + len(result.output_ids) + len(obs.ids) >= run.s.response_length_total:
            obs, end = None, "response_budget"  # an observation is useful only if a token can follow it
    else:
        end = action  # answer | eos | invalid
    if obs is not None:
        record.observation_ids, record.observation_images = list(obs.ids), list(obs.images)
    run.append(list(result.output_ids), result.logprobs, result.weight_version, obs)
    run.turns.append(record)
    return end


async def run_trajectory(
    generator: Generator,
    processor: Any,
    tools: SearchTools,
    task: Task,
    settings: LoopSettings,
    *,
    prompts: Prompts | None = None,
    sampling_params: SamplingParams | None = None,
    uid: str | None = None,
    prompt_ids: list[int] | None = None,
    reward_fn: Callable[[VLTrajectory], float] | None = None,
) -> VLTrajectory:
    """Roll out one trajectory of `task` (see the module docstring); `prompt_ids` may be precomputed."""
    prompts = prompts or Prompts()
    ids = list(prompt_ids) if prompt_ids is not None else first_prompt_ids(processor, prompts, task)
    run = _Run(generator, processor, tools, task, settings, prompts, ids)
    base = sampling_params or SamplingParams()
    end = ""
    for turn_index in range(settings.max_gen_round):
        end = await _turn(run, base, turn_index)
        if end:
            break
    trajectory = _finish(run, uid, end or "max_gen_round")
    check_invariants(trajectory, processor)
    if reward_fn is not None:
        trajectory.reward = float(reward_fn(trajectory))
    if settings.print_outputs:
        print(f"[mm agent data_id={task.data_id} end={trajectory.end_reason}] {trajectory.response_text}", flush=True)
    return trajectory


def _finish(run: _Run, uid: str | None, end_reason: str) -> VLTrajectory:
    task = run.task
    trajectory = VLTrajectory(
        uid=uid or uuid.uuid4().hex,
        prompt_ids=list(run.prompt_ids),
        response_ids=run.response_ids,
        response_mask=run.response_mask,
        turns=run.turns,
        response_text=run.p.tokenizer.decode(run.response_ids),
        answers=list(task.answers),
        rollout_logprobs=run.logprobs,
        rollout_versions=run.versions,
        end_reason=end_reason,
        images=run.images,
        data_id=task.data_id,
        category=task.category,
        data_source=task.data_source,
        question=task.question,
    )
    trajectory.metrics = {
        "turns": float(len(run.turns)),
        **{k: float(v) for k, v in run.counts.items()},
        **run.length_metrics(),
    }
    return trajectory


async def run_group(
    generator: Generator,
    processor: Any,
    tools: SearchTools,
    task: Task,
    settings: LoopSettings,
    group_size: int,
    *,
    prompts: Prompts | None = None,
    sampling_params: SamplingParams | None = None,
    uid: str | None = None,
    reward_fn: Callable[[VLTrajectory], float] | None = None,
) -> list[VLTrajectory]:
    """`group_size` trajectories of one task, concurrently, sharing one uid (the GRPO group) and prompt ids."""
    if group_size < 1:
        raise ValueError(f"algorithm.group_size must be >= 1, got {group_size}")
    prompts = prompts or Prompts()
    ids = first_prompt_ids(processor, prompts, task)
    uid = uid or uuid.uuid4().hex
    return list(
        await asyncio.gather(
            *(
                run_trajectory(
                    generator,
                    processor,
                    tools,
                    task,
                    settings,
                    prompts=prompts,
                    sampling_params=sampling_params,
                    uid=uid,
                    prompt_ids=ids,
                    reward_fn=reward_fn,
                )
                for _ in range(group_size)
            )
        )
    )
