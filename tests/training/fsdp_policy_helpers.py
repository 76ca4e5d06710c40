"""Shared set-up of the HF (vision-language) policy tests: real multimodal trajectories and the DP worker."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import torch

from rlinf_ext.agent.mmsearch.loop import LoopSettings, SearchTools, run_group
from rlinf_ext.agent.mmsearch.protocol import STOPS
from rlinf_ext.agent.mmsearch.types import Task
from rlinf_ext.config.schema import ImageSearchToolConfig
from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.generation.hf_vl import HFVLGenerator
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.tools.config import SearchToolConfig
from rlinf_ext.tools.image_search import ImageSearch
from rlinf_ext.tools.search import SearchTool
from rlinf_ext.training.fsdp_policy import FSDPPolicy
from rlinf_ext.training.grpo_policy import MMSample
from rlinf_ext.training.settings import ActorSettings
from tests.support.scripted import ForcedFirstTurn

PX = 56 * 56
TEMPERATURE = 1.3


def mm_trajectories(
    mm, model_dir: Path, n_tasks: int = 3, group: int = 4, seed: int = 0, first_turn: str | None = None
):
    """`group` sampled trajectories per task from the real MM loop, the CPU VL engine and the tiny image cache;
    ``first_turn``: every trajectory's first turn is forced to this text (`ForcedFirstTurn`), the rest sampled."""
    gen = HFVLGenerator.from_pretrained(model_dir, num_threads=None, return_logprobs=True, seed=seed)
    if first_turn is not None:
        gen.logits_processors = [ForcedFirstTurn(gen.processor.tokenizer, first_turn)]
    tools = SearchTools(
        ImageSearch(
            ImageSearchToolConfig(
                backend="cache_dir",
                cache_path=str(mm.cache_train),
                topk=2,
                thumbnail_min_pixels=PX,
                thumbnail_max_pixels=PX,
            )
        ),
        SearchTool(SearchToolConfig(backend="dummy", topk=1)),
    )
    settings = LoopSettings.with_defaults(max_gen_round=3, response_length_total=1024, max_obs_length=64)
    params = SamplingParams(max_new_tokens=40, do_sample=True, temperature=TEMPERATURE, stop=list(STOPS))
    tasks = [Task.from_row(r) for r in read_fvqa(mm.fvqa_train, PX, PX, limit=n_tasks)]

    async def run():
        return [
            t
            for task in tasks
            for t in await run_group(gen, gen.processor, tools, task, settings, group, sampling_params=params)
        ]

    return asyncio.run(run())


def samples_of(trajectories, rewards=None) -> list[MMSample]:
    return [
        MMSample(
            t.prompt_ids,
            t.response_ids,
            t.response_mask,
            reward=float(rewards[i]) if rewards is not None else 0.0,
            images=list(t.images),
        )
        for i, t in enumerate(trajectories)
    ]


def settings(**kw) -> ActorSettings:
    base = dict(group_size=2, optimizer="sgd", lr=1.0, clip_grad=0.0, temperature=TEMPERATURE, seed=3, weight_decay=0.0)
    base.update(kw)
    return ActorSettings(**base)


def stream_path(out: str | Path, rank: int) -> Path:
    return Path(f"{out}.stream-rank{rank}")


def save_streamed_weights(policy: FSDPPolicy, out: str | Path, rank: int, dtype: torch.dtype | None = None) -> None:
    """This rank's view of the weights in a sync where every rank sends (``iter_hf_weights``: collective, every
    rank calls it), as an ordered list, for ``check_every_rank_streams``."""
    torch.save([(name, tensor.clone()) for name, tensor in policy.iter_hf_weights(dtype)], stream_path(out, rank))


def check_every_rank_streams(out: str | Path, full: dict[str, torch.Tensor], world: int) -> None:
    """Every rank streamed the whole model: the names of rank 0's full state dict (``hf_state_dict``, what
    checkpoints write), in its order, each tensor equal to it."""
    for rank in range(world):
        streamed = torch.load(stream_path(out, rank))
        assert [name for name, _ in streamed] == list(full), f"rank {rank} streamed other names"
        for name, tensor in streamed:
            assert tensor.dtype == full[name].dtype and torch.equal(tensor, full[name]), (rank, name)


def dp_worker(rank: int, world: int, port: int, model_dir: str, payload: str, out: str, scale_loss: bool) -> None:
    """One gloo rank: FSDP2 policy, this rank's GRPO groups, one step; rank 0 writes the full weights, every rank
    its streamed weights (``save_streamed_weights``)."""
    from rlinf_ext.training.data_parallel import ShardLayout
    from rlinf_ext.training.fsdp_policy import FSDPStep
    from tests.support.gloo_dp import init_gloo_dp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dp = init_gloo_dp()
    samples, group_size = torch.load(payload, weights_only=False)
    share = len(samples) // world
    mine = list(range(rank * share, (rank + 1) * share))
    policy = FSDPPolicy(model_dir, settings(group_size=group_size), dp=dp)
    if not scale_loss:
        FSDPStep.scale_loss = lambda self, loss: loss  # the bug the scaling prevents (averaged gradients)
    policy.train_step([samples[i] for i in mine], step=0, layout=ShardLayout(tuple(mine), len(samples)))
    state = policy.hf_state_dict()  # collective; rank 0 alone gets the weights
    save_streamed_weights(policy, out, rank)
    if rank == 0:
        torch.save(state, out)
    torch.distributed.destroy_process_group()
