"""The warm-started tiny Qwen2.5-VL: supervised turns of the three paths, and an over-searching habit.

Each training trajectory is produced by the real MMSearch-R1 loop (`agent.mmsearch.loop`) with a playback engine
that "samples" the scripted turns (`mm_trajectories.scripted_turns`), the train split's image-search cache
and a BM25 text search over the corpus. So the ids, masks, observations and images are exactly what the
rollout will produce; the loss is on the mask-1 (model-written) tokens only. On `over_search` of the colour
questions, which need no search, the scripted path runs an image search first: the warm start over-searches,
the behaviour MMSearch-R1's search penalty should teach away (part 2's GRPO).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from rlinf_ext.agent.mmsearch.loop import MMLoopSettings, MMTools, first_prompt_ids, run_mm_trajectory
from rlinf_ext.agent.mmsearch.prompts import MMPrompts
from rlinf_ext.agent.mmsearch.types import MMTask, MMTrajectory
from rlinf_ext.assets import mm_models
from rlinf_ext.assets.mm_paths import mm_layout
from rlinf_ext.assets.mm_trajectories import answer_turn, scripted_turns
from rlinf_ext.assets.mm_world import KIND_COLOUR, EmblemSpec, MMQuestion, draw_emblem
from rlinf_ext.assets.sft import corpus_retriever
from rlinf_ext.config.schema import ImageSearchToolConfig
from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.generation.hf_vl import ImageInputs, load_vl_processor
from rlinf_ext.protocol.generation import GenerationResult
from rlinf_ext.protocol.images import canonicalize
from rlinf_ext.protocol.vl_tokens import mm_token_type_ids
from rlinf_ext.tools.documents import document_from_row
from rlinf_ext.tools.image_search import ImageSearchTool
from rlinf_ext.tools.search import SearchResult

PX = mm_models.TINY_MIN_PIXELS


@dataclass(frozen=True)
class MMSFTConfig:
    shape: mm_models.TinyVLShape = mm_models.TinyVLShape(hidden_size=128, intermediate_size=352,
                                                          vision_hidden_size=64, vision_intermediate_size=128)
    steps: int = 200
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    over_search: float = 0.7  # share of colour questions whose scripted path searches first
    # Phase A, before the trajectories: short direct colour answers on freshly jittered emblems of the train
    # cities (one image, ~130 tokens each, so ~4x cheaper per step). The vision tower learns colour from pixels
    # here; with trajectories alone it stayed at chance (greedy colour accuracy 2/12 after 200 steps).
    colour_steps: int = 150
    colour_batch_size: int = 16
    colour_images_per_city: int = 12
    topk: int = 3
    threads: int = 1  # one torch thread: two on a busy 2-core box ran many times slower


class PlaybackGenerator:
    """A `Generator` that "samples" the planned turn texts of the current task, one per call."""

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.plan, self.turn = tokenizer, [], 0

    def start(self, plan: list[str]) -> None:
        self.plan, self.turn = list(plan), 0

    async def generate(self, prompt_ids, sampling_params, images=None) -> GenerationResult:
        text = self.plan[self.turn]
        self.turn += 1
        return GenerationResult(self.tokenizer.encode(text, add_special_tokens=False), text, "stop", None)


class CorpusTextSearch:
    """`async search(query)` over the tiny corpus with BM25 (the retrieval server's stand-in offline)."""

    def __init__(self, corpus_path: Path, topk: int):

        self.retriever, self.topk = corpus_retriever(corpus_path), topk

    async def search(self, query: str):

        docs = self.retriever.search([query], self.topk)[0]
        return SearchResult(query=query, ok=True, documents=[document_from_row(d) for d in docs], attempts=1)


def load_scripted_paths(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["data_id"]: r for r in rows}


def plan_for(task: MMTask, path: dict, rng: random.Random, over_search: float) -> list[str]:
    q = MMQuestion(path["kind"], path["city"], task.question, tuple(task.answers), path.get("query"))
    return scripted_turns(q, search_colour=q.kind == KIND_COLOUR and rng.random() < over_search)


def build_trajectories(processor, tasks: list[MMTask], scripted: dict[str, dict], cache_dir: Path,
                       corpus_path: Path, cfg: MMSFTConfig, seed: int) -> list[MMTrajectory]:
    """The loop's own trajectories for the planned turns (one task at a time: the playback is sequential)."""

    rng = random.Random(seed)
    gen = PlaybackGenerator(processor.tokenizer)
    image = ImageSearchTool(ImageSearchToolConfig(backend="cache_dir", cache_path=str(cache_dir), topk=cfg.topk,
                                                  thumbnail_min_pixels=PX, thumbnail_max_pixels=PX))
    tools = MMTools(image, CorpusTextSearch(corpus_path, cfg.topk))
    settings = MMLoopSettings(max_gen_round=3, image_search_limit=1, text_search_limit=1,
                              response_length_total=4096, max_obs_length=320)

    async def all_of_them():
        out = []
        for t in tasks:
            gen.start(plan_for(t, scripted[t.data_id], rng, cfg.over_search))
            out.append(await run_mm_trajectory(gen, processor, tools, t, settings, prompts=MMPrompts()))
        return out

    return asyncio.run(all_of_them())


def colour_examples(processor, root: Path, cities: list[str], per_city: int, seed: int) -> list[MMTrajectory]:
    """One-turn colour trajectories (prompt + the direct answer, mask 1) on new jitters of each city's emblem."""


    specs = {c: EmblemSpec(**s) for c, s in json.loads(mm_layout(root).emblems.read_text()).items()}
    rng, prompts, out = random.Random(seed), MMPrompts(), []
    question = "What colour is the emblem in the image?"
    for city in cities:
        for _ in range(per_city):
            image = canonicalize(draw_emblem(specs[city], rng), PX, PX)
            task = MMTask(f"colour-{city}", question, (image,), (specs[city].colour,), "search_free", "tinymm_colour")
            ids = processor.tokenizer.encode(answer_turn(f"The emblem is {specs[city].colour}.", specs[city].colour),
                                             add_special_tokens=False)
            out.append(MMTrajectory(uid=task.data_id, prompt_ids=first_prompt_ids(processor, prompts, task),
                                    response_ids=ids, response_mask=[1] * len(ids), turns=[], response_text="",
                                    answers=list(task.answers), images=[image]))
    return out


def _batch(model, image_inputs, trajs: list[MMTrajectory], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded rows, labels -100 off the model's own tokens, images concatenated in row order."""
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    ids = torch.full((len(trajs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(trajs), width), -100, dtype=torch.long)
    attention = torch.zeros((len(trajs), width), dtype=torch.long)
    for row, t in enumerate(trajs):
        seq = t.prompt_ids + t.response_ids
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        for k, (tok, m) in enumerate(zip(t.response_ids, t.response_mask)):
            if m:
                labels[row, len(t.prompt_ids) + k] = tok
    vision = image_inputs.batch([img for t in trajs for img in t.images])
    types = mm_token_type_ids(ids, model.config.image_token_id)  # transformers 5: else text-only positions
    return {"input_ids": ids, "attention_mask": attention, "labels": labels, "mm_token_type_ids": types, **vision}


def train(model, image_inputs, trajs: list[MMTrajectory], cfg: MMSFTConfig, seed: int, pad_id: int,
          steps: int | None = None, batch_size: int | None = None) -> list[float]:
    """AdamW with warm-up and cosine decay to lr/10 over `steps` random batches of `trajs`."""

    steps, batch_size = steps or cfg.steps, batch_size or cfg.batch_size
    torch.set_num_threads(cfg.threads)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    model.train()
    losses = []
    for _ in range(steps):
        batch = _batch(model, image_inputs, rng.sample(trajs, min(batch_size, len(trajs))), pad_id)
        loss = model(**batch).loss  # HF shifts labels; mrope positions from get_rope_index (position_ids=None)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return losses


def build_mm_sft_model(root: Path, seed: int, log: Callable[..., None], cfg: MMSFTConfig | None = None) -> dict:
    """Train `mm/models/qwen2.5-vl-tiny-sft` on the train split; returns (and saves) a report."""

    cfg = cfg or MMSFTConfig()
    paths = mm_layout(root)
    processor = load_vl_processor(paths.processor_dir)
    rows = read_fvqa(paths.fvqa_train, PX, PX)
    tasks = [MMTask.from_row(r) for r in rows]
    scripted = load_scripted_paths(paths.train_paths)
    t0, cpu0 = time.perf_counter(), time.process_time()
    trajs = build_trajectories(processor, tasks, scripted, paths.cache_train, root / "corpus" / "wiki.jsonl", cfg, seed)
    model = mm_models.make_qwen2_5_vl(processor.tokenizer, cfg.shape, seed + 21)
    images, pad = ImageInputs(processor.image_processor, capacity=4096), processor.tokenizer.pad_token_id
    colour_losses = []
    if cfg.colour_steps > 0:
        cities = sorted({p["city"] for p in scripted.values()})
        colour = colour_examples(processor, root, cities, cfg.colour_images_per_city, seed + 23)
        colour_losses = train(model, images, colour, cfg, seed + 24, pad, cfg.colour_steps, cfg.colour_batch_size)
    losses = train(model, images, trajs, cfg, seed + 22, pad)
    out = paths.qwen2_5_vl_tiny_sft
    mm_models.save_vl_model(model, processor, out)
    searched = sum(1 for t in trajs if t.data_source == "tinymm_colour" and len(t.turns) > 1)
    report = {"config": {**asdict(cfg), "shape": asdict(cfg.shape)}, "trajectories": len(trajs),
              "colour_trajectories_searching": searched, "train_seconds": round(time.perf_counter() - t0, 1),
              "train_cpu_seconds": round(time.process_time() - cpu0, 1),
              "colour_last_loss": round(sum(colour_losses[-10:]) / max(1, len(colour_losses[-10:])), 4),
              "first_loss": round(losses[0], 4),
              "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4)}
    (out / "sft_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"mm sft: {len(trajs)} trajectories ({searched} over-searching colour ones), {cfg.steps} steps in "
        f"{report['train_seconds']}s, loss {report['first_loss']} -> {report['last_loss']} -> {out}")
    return report
