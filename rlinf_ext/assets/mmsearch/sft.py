"""The warm-started tiny Qwen2.5-VL: supervised turns of the three paths, and an over-searching habit.

Each training trajectory is produced by the real MMSearch-R1 loop (`agent.mmsearch.loop`) with a playback engine
that "samples" the scripted turns (`trajectories.scripted_turns`), the train split's image-search cache
and a BM25 text search over the corpus. So the ids, masks, observations and images are exactly what the
rollout will produce; the loss is on the mask-1 (model-written) tokens only. On `over_search` of the colour
questions, which need no search, the scripted path runs an image search first: the warm start over-searches,
the behaviour MMSearch-R1's search penalty should teach away (part 2's GRPO).

For that lesson to be learnable the warm start's direct colour answers must be right about as often as its
searched ones: if they are mostly wrong, searching pays whatever the penalty (docs/results.md, 15b). So a colour
phase first teaches the vision tower the six colours, and during the trajectories a few of its direct answers
per step keep that reading from wearing down; they are also the warm start's only direct colour answers
(`colour_openings_per_step`: 2 direct to 2.67 search-first colour answers per step; measured, it opens with a
search on ~74% of the colour questions and answers them right either way, docs/results.md 15c).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from rlinf_ext.agent.mmsearch.loop import LoopSettings, SearchTools, first_prompt_ids, run_trajectory
from rlinf_ext.agent.mmsearch.prompts import Prompts
from rlinf_ext.agent.mmsearch.types import Task, VLTrajectory
from rlinf_ext.assets.core import sft as sft_loop
from rlinf_ext.assets.core.playback import PlaybackGenerator
from rlinf_ext.assets.core.search import CorpusTextSearch, corpus_retriever
from rlinf_ext.assets.core.sft import SFTExample, Stream
from rlinf_ext.assets.mmsearch import models as vl_models
from rlinf_ext.assets.mmsearch.paths import layout
from rlinf_ext.assets.mmsearch.trajectories import answer_turn, scripted_turns
from rlinf_ext.assets.mmsearch.world import KIND_COLOUR, EmblemSpec, Question, draw_emblem
from rlinf_ext.config.schema import ImageSearchToolConfig
from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.generation.hf_vl import ImageInputs, load_vl_processor
from rlinf_ext.protocol.images import canonicalize
from rlinf_ext.protocol.vl_tokens import mm_token_type_ids
from rlinf_ext.tools.image_search import ImageSearchTool

PX = vl_models.TINY_MIN_PIXELS
COLOUR_SOURCE = f"tinymm_{KIND_COLOUR}"  # the FVQA data_source of the colour questions (assets/mmsearch/tiny.py)


@dataclass(frozen=True)
class SFTConfig:
    shape: vl_models.TinyVLShape = vl_models.TinyVLShape(hidden_size=128, intermediate_size=352,
                                                          vision_hidden_size=64, vision_intermediate_size=128)
    steps: int = 200
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    over_search: float = 1.0  # share of colour trajectories whose scripted path searches first (exactly, rounded)
    # Phase A, before the trajectories: short direct colour answers on freshly jittered emblems of the train
    # cities (one image, ~130 tokens each, so ~4x cheaper per step). The vision tower learns colour from pixels
    # here; with trajectories alone it stayed at chance (greedy colour accuracy 2/12 after 200 steps). 150 steps
    # left it at 0.42 on held-out cities (loss still falling); 300 steps: 1.00 (docs/results.md, 15c).
    colour_steps: int = 300
    colour_batch_size: int = 16
    colour_images_per_city: int = 12
    # Phase B: this many of phase A's direct colour answers per step beside the trajectories. Without them the
    # colour reading after phase B was a lottery of the data draw (held-out colour accuracy 0.33-0.92 for
    # over_search 0.6-0.7); 4 kept it (1.00) but left the search too rare (38%, greedy never); 2 with
    # over_search 1.0: 1.00 and 74% (docs/results.md, 15c).
    colour_replay: int = 2
    topk: int = 3
    threads: int = 1  # one torch thread: two on a busy 2-core box ran many times slower


def load_scripted_paths(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["data_id"]: r for r in rows}


def searching_colour_ids(scripted: dict[str, dict], share: float, seed: int) -> set[str]:
    """The colour questions whose scripted path searches first: exactly round(share * n) of the n, a seeded
    choice (a per-question coin gave 56 of 92 for 0.7)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"over_search must be a share in [0, 1], got {share}")
    colour = sorted(i for i, p in scripted.items() if p["kind"] == KIND_COLOUR)
    return set(random.Random(seed).sample(colour, round(share * len(colour))))


def colour_openings_per_step(cfg: SFTConfig, n_trajectories: int, n_colour: int,
                             n_searching: int) -> tuple[float, float]:
    """(direct, search-first) colour answers per phase-B step, in expectation: the colour share of the trajectory
    batch plus the replayed direct answers."""
    per_trajectory = cfg.batch_size / n_trajectories
    return per_trajectory * (n_colour - n_searching) + cfg.colour_replay, per_trajectory * n_searching


def plan_for(task: Task, path: dict, search_colour: bool) -> list[str]:
    q = Question(path["kind"], path["city"], task.question, tuple(task.answers), path.get("query"))
    return scripted_turns(q, search_colour=search_colour)


def build_trajectories(processor, tasks: list[Task], scripted: dict[str, dict], cache_dir: Path,
                       corpus_path: Path, cfg: SFTConfig, seed: int) -> list[VLTrajectory]:
    """The loop's own trajectories for the planned turns (one task at a time: the playback is sequential)."""

    searching = searching_colour_ids(scripted, cfg.over_search, seed)
    gen = PlaybackGenerator(processor.tokenizer)
    image = ImageSearchTool(ImageSearchToolConfig(backend="cache_dir", cache_path=str(cache_dir), topk=cfg.topk,
                                                  thumbnail_min_pixels=PX, thumbnail_max_pixels=PX))
    tools = SearchTools(image, CorpusTextSearch(corpus_retriever(corpus_path), cfg.topk))
    settings = LoopSettings(max_gen_round=3, image_search_limit=1, text_search_limit=1,
                              response_length_total=4096, max_obs_length=320)

    async def all_of_them():
        out = []
        for t in tasks:
            gen.start(plan_for(t, scripted[t.data_id], t.data_id in searching))
            out.append(await run_trajectory(gen, processor, tools, t, settings, prompts=Prompts()))
        return out

    return asyncio.run(all_of_them())


def colour_examples(processor, root: Path, cities: list[str], per_city: int, seed: int) -> list[VLTrajectory]:
    """One-turn colour trajectories (prompt + the direct answer, mask 1) on new jitters of each city's emblem."""


    specs = {c: EmblemSpec(**s) for c, s in json.loads(layout(root).emblems.read_text()).items()}
    rng, prompts, out = random.Random(seed), Prompts(), []
    question = "What colour is the emblem in the image?"
    for city in cities:
        for _ in range(per_city):
            image = canonicalize(draw_emblem(specs[city], rng), PX, PX)
            task = Task(f"colour-{city}", question, (image,), (specs[city].colour,), "search_free", COLOUR_SOURCE)
            ids = processor.tokenizer.encode(answer_turn(f"The emblem is {specs[city].colour}.", specs[city].colour),
                                             add_special_tokens=False)
            out.append(VLTrajectory(uid=task.data_id, prompt_ids=first_prompt_ids(processor, prompts, task),
                                    response_ids=ids, response_mask=[1] * len(ids), turns=[], response_text="",
                                    answers=list(task.answers), images=[image]))
    return out


def train(model, image_inputs, streams: list[tuple[list[VLTrajectory], int]], cfg: SFTConfig, seed: int,
          pad_id: int) -> list[float]:
    """The shared warm-start loop (`assets/core/sft.py`): `cfg.steps` steps on one batch of each (trajectories,
    batch size) stream (stream i shuffled with seed + i), loss on their mask-1 tokens, images through the
    processor's `image_inputs`."""
    built = [Stream([SFTExample.from_trajectory(t) for t in trajs], size, seed + i)
             for i, (trajs, size) in enumerate(streams)]
    def vision_inputs(ids, images):  # transformers 5: without modality ids the positions are text-only
        return {**image_inputs.batch(images), "mm_token_type_ids": mm_token_type_ids(ids, model.config.image_token_id)}

    return sft_loop.train(model, built, cfg, pad_id, vision_inputs=vision_inputs, progress=False,
                          desc="mm warm-start SFT")


def build_mm_sft_model(root: Path, seed: int, log: Callable[..., None], cfg: SFTConfig | None = None) -> dict:
    """Train `mm/models/qwen2.5-vl-tiny-sft` on the train split; returns (and saves) a report."""

    cfg = cfg or SFTConfig()
    paths = layout(root)
    processor = load_vl_processor(paths.processor_dir)
    rows = read_fvqa(paths.fvqa_train, PX, PX)
    tasks = [Task.from_row(r) for r in rows]
    scripted = load_scripted_paths(paths.train_paths)
    t0, cpu0 = time.perf_counter(), time.process_time()
    trajs = build_trajectories(processor, tasks, scripted, paths.cache_train, root / "corpus" / "wiki.jsonl", cfg, seed)
    model = vl_models.make_qwen2_5_vl(processor.tokenizer, cfg.shape, seed + 21)
    images, pad = ImageInputs(processor.image_processor, capacity=4096), processor.tokenizer.pad_token_id
    colour_losses, colour = [], []
    if cfg.colour_steps > 0 or cfg.colour_replay > 0:
        cities = sorted({p["city"] for p in scripted.values()})
        colour = colour_examples(processor, root, cities, cfg.colour_images_per_city, seed + 23)
    if cfg.colour_steps > 0:
        colour_losses = train(model, images, [(colour, cfg.colour_batch_size)], replace(cfg, steps=cfg.colour_steps),
                              seed + 24, pad)
    losses = train(model, images, [(trajs, cfg.batch_size), (colour, cfg.colour_replay)], cfg, seed + 22, pad)
    out = paths.qwen2_5_vl_tiny_sft
    vl_models.save_vl_model(model, processor, out)
    n_colour = sum(1 for t in trajs if t.data_source == COLOUR_SOURCE)
    searched = sum(1 for t in trajs if t.data_source == COLOUR_SOURCE and len(t.turns) > 1)
    direct, search_first = colour_openings_per_step(cfg, len(trajs), n_colour, searched)
    report = {"config": {**asdict(cfg), "shape": asdict(cfg.shape)}, "trajectories": len(trajs),
              "colour_trajectories_searching": searched,
              "colour_answers_per_step": {"direct": round(direct, 3), "search_first": round(search_first, 3)}, "train_seconds": round(time.perf_counter() - t0, 1),
              "train_cpu_seconds": round(time.process_time() - cpu0, 1),
              "colour_last_loss": round(sum(colour_losses[-10:]) / max(1, len(colour_losses[-10:])), 4),
              "first_loss": round(losses[0], 4),
              "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4)}
    (out / "sft_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"mm sft: {len(trajs)} trajectories ({searched} over-searching colour ones), {cfg.steps} steps in "
        f"{report['train_seconds']}s, loss {report['first_loss']} -> {report['last_loss']} -> {out}")
    return report
