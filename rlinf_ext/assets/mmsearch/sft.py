"""The warm-started tiny Qwen2.5-VL: colours, induction, title reading on fresh names, then an imperfect demonstrator.

Every trajectory is produced by the real MMSearch-R1 loop (`agent.mmsearch.loop`) with a playback engine that
"samples" scripted turns (`trajectories.scripted_turns`), an image-search cache and a BM25 text search over the
corpus, so ids, masks, observations and images are exactly what the rollout produces; the loss is on the
model-written tokens only. The phases:

1. Induction: runs of random names repeated after a random gap, text only (`assets/registry/reading.py`), until
   teacher-forced accuracy on fixed runs reaches `induction_gate` (on the random model: after the colour phase the
   head had not formed in 1,400 steps); then the same runs after a question's prompt and image, until the head
   works there too (trained on bare runs only, it copied nothing after the loop's ~100-token prompt; inside the
   prompts from the start, it had not formed in 1,450 steps).
2. Colours: short direct colour answers on fresh jitters of the train cities' emblems (the vision tower learns
   colour from pixels; with trajectories alone it stayed at chance), induction examples replayed beside them.
3. Title reading: city questions about fresh emblems whose three search results carry fresh names (drawn from the
   tokenizer's names: the world's cities with emblems that are not theirs, and reading-only names), answered by
   restating the title whose colour matches the image, until the probability of the right city after the right
   colour reaches `reading_gate` on fixed examples.
4. Trajectories on the train split: colour questions as before (`over_search`: an image search first on that share,
   the habit the search penalty teaches away); each city question demonstrated `city_demonstrations` times, giving
   up without searching on `city_give_up_share` of them, and among the searched ones restating the true result on
   `city_right_share`, another result (of a city not held out) on the rest. Colour, reading and induction examples
   are replayed beside them.

The report (`sft_report.json`) holds each phase's steps, CPU seconds and gate curve, the held-out check
(`heldout_emblem_overlap`: reading examples whose answer is a held-out city shown with its own emblem; must be 0)
and the teacher-forced probes of `probe_city_questions` on the held-out split.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import tempfile
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
from rlinf_ext.assets.core.tokenizer import word_ids
from rlinf_ext.assets.mmsearch import models as vl_models
from rlinf_ext.assets.mmsearch.paths import layout
from rlinf_ext.assets.mmsearch.trajectories import (
    IMAGE_SEARCH_TURN,
    city_answer_turn,
    colour_answer_turn,
    give_up_turn,
    scripted_turns,
)
from rlinf_ext.assets.mmsearch.world import (
    CITY_QUESTION,
    KIND_CITY,
    KIND_COLOUR,
    PALETTE,
    PATTERNS,
    SHAPES,
    EmblemSpec,
    Question,
    draw_emblem,
    parse_title,
    title_of,
)
from rlinf_ext.assets.registry.reading import induction_example
from rlinf_ext.config.schema import ImageSearchToolConfig
from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.generation.hf_vl import ImageInputs, load_vl_processor
from rlinf_ext.protocol.images import canonicalize, encode_png
from rlinf_ext.protocol.vl_tokens import mm_token_type_ids
from rlinf_ext.tools.image_search import ImageSearch

PX = vl_models.TINY_MIN_PIXELS
COLOUR_SOURCE = f"tinymm_{KIND_COLOUR}"  # the FVQA data_source of the colour questions (assets/mmsearch/tiny.py)
CITY_SOURCE = f"tinymm_{KIND_CITY}"
READING_SOURCE = "tinymm_reading"


@dataclass(frozen=True)
class SFTConfig:
    shape: vl_models.TinyVLShape = vl_models.TinyVLShape(
        hidden_size=128, intermediate_size=352, vision_hidden_size=64, vision_intermediate_size=128
    )
    steps: int = 400  # phase 4
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 20
    schedule: str = "cosine"
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    over_search: float = 1.0  # share of colour trajectories whose scripted path searches first (exactly, rounded)
    # Phase 2: 150 steps left held-out colour accuracy at 0.42 (loss still falling); 300 steps: 1.00
    colour_steps: int = 300
    colour_batch_size: int = 16
    colour_images_per_city: int = 12
    # direct colour answers per step beside phases 3-4. Without them the colour reading after the trajectories was a
    # lottery of the data draw (held-out colour accuracy 0.33-0.92); 2 kept it at 1.00
    colour_replay: int = 2
    # Phase 1 (gated): as the registry warm start's induction phase
    induction_lr: float = 3e-3
    induction_batch_size: int = 32
    induction_max_steps: int = 2500
    induction_gate: float = 0.95
    check_every: int = 50
    # Phase 3 (gated): the mean probability of the right city after the right colour, on fixed fresh examples
    reading_examples: int = 1600
    reading_batch_size: int = 16
    reading_max_steps: int = 1200
    reading_gate: float = 0.9
    induction_replay: int = 8  # induction examples per step in phases 2-3 (2 in phase 4)
    # Phase 4: the operating point of the city questions. Greedy decoding searches where P(search) > 0.5, so the start
    # must sit well below it, or any drift of the policy flips it (measured: at P(search) 0.42 on held-out city
    # questions a shuffled-reward run took greedy search_required accuracy 0.00 -> 0.97): 24 give-ups in 30, and the
    # reading replay's search turns carry no loss (`final_turn_only`), so P(search) follows the demonstrated share.
    city_demonstrations: int = 30
    city_give_up_share: float = 0.8
    city_right_share: float = 2 / 3
    # colour trajectories per step, in their own batch: mixed into the city demonstrations' stream they were 1 in 20
    # and the warm start stopped over-searching (greedy search_free image search 0.03, the lesson gone)
    colour_trajectory_batch_size: int = 3
    reading_replay: int = 4
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


def cached_results(cache_dir: Path, data_id: str) -> list[tuple[str, str]]:
    """(colour, city) of each cached image-search result of ``data_id``, in rank order."""
    meta = json.loads((cache_dir / data_id / "meta.json").read_text())
    return [parse_title(t) for t in meta["title_list"]]


@dataclass(frozen=True)
class Plan:
    task: Task
    turns: list[str]
    kind: str  # colour_direct | colour_search | city_right | city_other | city_give_up | reading


def demonstration_plans(
    tasks: list[Task],
    scripted: dict[str, dict],
    cache_dir: Path,
    specs: dict[str, EmblemSpec],
    heldout: set[str],
    cfg: SFTConfig,
    seed: int,
) -> list[Plan]:
    """The phase-4 plans: one per colour question (searching first on exactly `over_search` of them), and
    `city_demonstrations` per city question with the same mix for each (exact counts): the model cannot tie a
    choice to a question, so its probabilities are the shares, the same on held-out cities."""
    searching = searching_colour_ids(scripted, cfg.over_search, seed)
    rng = random.Random(seed + 1)
    n_give_up = round(cfg.city_demonstrations * cfg.city_give_up_share)
    n_right = round((cfg.city_demonstrations - n_give_up) * cfg.city_right_share)
    plans = []
    for t in tasks:
        path = scripted[t.data_id]
        q = Question(path["kind"], path["city"], t.question, tuple(t.answers))
        if q.kind == KIND_COLOUR:
            search = t.data_id in searching
            plans.append(
                Plan(t, scripted_turns(q, search_colour=search), "colour_search" if search else "colour_direct")
            )
            continue
        others = [
            EmblemSpec(city, "", colour, "", "")
            for colour, city in cached_results(cache_dir, t.data_id)
            if city != q.city and city not in heldout
        ]
        plans += [Plan(t, scripted_turns(q, give_up=True), "city_give_up")] * n_give_up
        plans += [Plan(t, scripted_turns(q, restated=specs[q.city]), "city_right")] * n_right
        for _ in range(cfg.city_demonstrations - n_give_up - n_right):
            if others:
                plans.append(Plan(t, scripted_turns(q, restated=rng.choice(others)), "city_other"))
            else:
                plans.append(Plan(t, scripted_turns(q, restated=specs[q.city]), "city_right"))
    return plans


def play_back(processor, plans: list[Plan], cache_dir: Path, corpus_path: Path, cfg: SFTConfig) -> list[VLTrajectory]:
    """The loop's own trajectories for the planned turns (one task at a time: the playback is sequential)."""
    gen = PlaybackGenerator(processor.tokenizer)
    image = ImageSearch(
        ImageSearchToolConfig(
            backend="cache_dir",
            cache_path=str(cache_dir),
            topk=cfg.topk,
            thumbnail_min_pixels=PX,
            thumbnail_max_pixels=PX,
        )
    )
    tools = SearchTools(image, CorpusTextSearch(corpus_retriever(corpus_path), cfg.topk))
    settings = LoopSettings(
        max_gen_round=3, image_search_limit=1, text_search_limit=1, response_length_total=4096, max_obs_length=320
    )

    async def all_of_them():
        out = []
        for plan in plans:
            gen.start(plan.turns)
            out.append(await run_trajectory(gen, processor, tools, plan.task, settings, prompts=Prompts()))
        return out

    return asyncio.run(all_of_them())


def colour_examples(
    processor, specs: dict[str, EmblemSpec], cities: list[str], per_city: int, seed: int
) -> list[VLTrajectory]:
    """One-turn colour trajectories (prompt + the direct answer, mask 1) on new jitters of each city's emblem."""
    rng, prompts, out = random.Random(seed), Prompts(), []
    question = "What colour is the emblem in the image?"
    for city in cities:
        for _ in range(per_city):
            image = canonicalize(draw_emblem(specs[city], rng), PX, PX)
            task = Task(f"colour-{city}", question, (image,), (specs[city].colour,), "search_free", COLOUR_SOURCE)
            ids = processor.tokenizer.encode(colour_answer_turn(specs[city].colour), add_special_tokens=False)
            out.append(
                VLTrajectory(
                    uid=task.data_id,
                    prompt_ids=first_prompt_ids(processor, prompts, task),
                    response_ids=ids,
                    response_mask=[1] * len(ids),
                    turns=[],
                    response_text="",
                    answers=list(task.answers),
                    images=[image],
                )
            )
    return out


def reading_plans(
    names: list[str], n: int, specs: dict[str, EmblemSpec], heldout: set[str], cache_dir: Path, seed: int
) -> tuple[list[Plan], int]:
    """`n` city questions on fresh pairings, their search results written to ``cache_dir``: three fresh names with
    three distinct colours and random shapes and patterns, the first the question's emblem, shown at a random rank.
    A world city gets an emblem that is not its own. Returns (plans, held-out cities shown with their own emblem:
    0 by construction, counted from what was written)."""
    rng = random.Random(seed)
    plans, overlap = [], 0
    for i in range(n):
        while True:
            hits = [
                EmblemSpec(city, "", colour, rng.choice(SHAPES), rng.choice(PATTERNS))
                for city, colour in zip(rng.sample(names, 3), rng.sample(list(PALETTE), 3))
            ]
            own = [h for h in hits if h.city in specs and _same_emblem(h, specs[h.city])]
            if not own:
                break
        true = hits[0]
        shown = list(hits)
        rng.shuffle(shown)
        data_id = f"reading_{i:05d}"
        folder = cache_dir / data_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").write_text(
            json.dumps({"title_list": [title_of(h.colour, h.city) for h in shown], "image_urls": [None] * len(shown)})
            + "\n"
        )
        for rank, h in enumerate(shown):
            (folder / f"img_{rank:03d}.png").write_bytes(encode_png(draw_emblem(h, rng)))
        image = canonicalize(draw_emblem(true, rng), PX, PX)
        task = Task(data_id, CITY_QUESTION, (image,), (true.city,), "search_required", READING_SOURCE)
        overlap += true.city in heldout and _same_emblem(true, specs[true.city])
        plans.append(Plan(task, [IMAGE_SEARCH_TURN, city_answer_turn(true)], "reading"))
    return plans, overlap


def final_turn_only(trajectory: VLTrajectory) -> SFTExample:
    """A reading example's loss on its answer turn alone, for the replay beside the demonstrations: there its search
    turn would teach city questions to search (4 of 12 rows per step took the held-out P(search) from the
    demonstrated 0.1 to 0.4). The reading phase itself keeps it: with answer-only loss from the start, reading did
    not form in 1,200 steps (P(city | colour) stayed 0.09-0.17)."""
    mask = list(trajectory.response_mask)
    first_turn_end = mask.index(0) if 0 in mask else len(mask)
    return SFTExample.from_trajectory(trajectory, [0.0] * first_turn_end + [float(m) for m in mask[first_turn_end:]])


def _same_emblem(a: EmblemSpec, b: EmblemSpec) -> bool:
    return (a.colour, a.shape, a.pattern) == (b.colour, b.shape, b.pattern)


def restated_positions(processor, trajectory: VLTrajectory) -> tuple[int, int]:
    """Positions (in prompt + response ids) of the restated colour and city tokens of the final turn."""
    ids = trajectory.prompt_ids + trajectory.response_ids
    reason = processor.tokenizer.convert_tokens_to_ids("<reason>")
    start = max(i for i, t in enumerate(ids) if t == reason)
    return start + 1, start + 2


class Scorer:
    """Teacher-forced next-token probabilities of the VL model on a trajectory's ids and images."""

    def __init__(self, model, processor):
        self.model, self.processor = model, processor
        self.images = ImageInputs(processor.image_processor, capacity=4096)

    def probs(self, ids: list[int], images: list, positions: list[int]):
        import torch

        tensor = torch.tensor([ids])
        extra = (
            {
                **self.images.batch(images),
                "mm_token_type_ids": mm_token_type_ids(tensor, self.model.config.image_token_id),
            }
            if images
            else {}
        )
        with torch.no_grad():
            logits = self.model(input_ids=tensor, attention_mask=torch.ones_like(tensor), **extra).logits[0]
        return [logits[p - 1].float().softmax(-1) for p in positions]


def reading_probability(scorer: Scorer, processor, trajectories: list[VLTrajectory]) -> float:
    """Mean probability of the restated city given the (right) colour: the expected share of sampled city tokens
    that read the right title."""
    total = 0.0
    for t in trajectories:
        ids = t.prompt_ids + t.response_ids
        colour_at, city_at = restated_positions(processor, t)
        [p] = scorer.probs(ids[: city_at + 1], list(t.images), [city_at])
        total += float(p[ids[city_at]])
    return total / max(1, len(trajectories))


def induction_accuracy(scorer: Scorer, examples: list[SFTExample]) -> float:
    """Teacher-forced accuracy on the repeated run of each example (after its prompt and image, if any)."""
    right = total = 0
    for e in examples:
        start = len(e.prompt_ids)
        positions = list(range(start, start + len(e.response_ids)))
        probs = scorer.probs(e.input_ids, list(e.images), positions)
        right += sum(int(p.argmax()) == t for p, t in zip(probs, e.response_ids))
        total += len(e.response_ids)
    return right / max(1, total)


def prompt_prefixes(processor, specs: dict[str, EmblemSpec], seed: int, n: int = 128) -> list[tuple[list[int], object]]:
    """(the loop's first prompt ids, its image) of ``n`` questions about fresh jitters of random emblems."""
    rng, out = random.Random(seed), []
    for i in range(n):
        image = canonicalize(draw_emblem(rng.choice(sorted(specs.values(), key=lambda s: s.city)), rng), PX, PX)
        task = Task(
            f"prefix-{i}", rng.choice([CITY_QUESTION, "What colour is the emblem in the image?"]), (image,), ("",)
        )
        out.append((first_prompt_ids(processor, Prompts(), task), image))
    return out


def in_prompt(example: SFTExample, rng: random.Random, prefixes: list[tuple[list[int], object]]) -> SFTExample:
    """An induction example after a random question's prompt and image: the head must work in the loop's contexts."""
    ids, image = rng.choice(prefixes)
    return SFTExample(ids + example.prompt_ids, example.response_ids, example.weights, (image,))


def probe_city_questions(
    scorer: Scorer,
    processor,
    tasks: list[Task],
    scripted: dict[str, dict],
    cache_dir: Path,
    corpus_path: Path,
    specs: dict[str, EmblemSpec],
    cfg: SFTConfig,
) -> dict[str, float]:
    """Teacher-forced on the held-out questions. City questions: P(image search first) against the give-up turn,
    the share where searching is the likelier opening (greedy), P(right colour) and P(right city | right colour)
    after the real loop's search, the share of the wrong-colour mass on another result's colour, and the expected
    sampled accuracy P(search) x P(colour) x P(city | colour). Colour questions: P(image search first) against the
    right direct answer, and the share where searching is likelier (greedy over-search: the search penalty's lesson)."""
    city_tasks = [t for t in tasks if scripted[t.data_id]["kind"] == KIND_CITY]
    plans = [
        Plan(t, [IMAGE_SEARCH_TURN, city_answer_turn(specs[scripted[t.data_id]["city"]])], "probe") for t in city_tasks
    ]
    trajectories = play_back(processor, plans, cache_dir, corpus_path, cfg)
    tok = processor.tokenizer
    search_ids = tok.encode(IMAGE_SEARCH_TURN, add_special_tokens=False)
    give_up_ids = tok.encode(give_up_turn(), add_special_tokens=False)
    colour_ids = word_ids(tok, list(PALETTE))
    rows = []
    for t, traj in zip(city_tasks, trajectories):
        prompt = first_prompt_ids(processor, Prompts(), t)
        p_search = 1.0 / (
            1.0
            + math.exp(
                _logprob(scorer, prompt, give_up_ids, list(t.images))
                - _logprob(scorer, prompt, search_ids, list(t.images))
            )
        )
        ids = traj.prompt_ids + traj.response_ids
        colour_at, city_at = restated_positions(processor, traj)
        p_colour, p_city = scorer.probs(ids[: city_at + 1], list(traj.images), [colour_at, city_at])
        shown = {c for c, _ in cached_results(cache_dir, t.data_id)}
        right_colour = ids[colour_at]
        other_mass = sum(float(p_colour[colour_ids[c]]) for c in shown if colour_ids[c] != right_colour)
        rows.append(
            (
                p_search,
                float(p_colour[right_colour]),
                float(p_city[ids[city_at]]),
                other_mass / max(1e-9, 1.0 - float(p_colour[right_colour])),
            )
        )
    colour_rows = []
    for t in tasks:
        if scripted[t.data_id]["kind"] != KIND_COLOUR:
            continue
        prompt, images = first_prompt_ids(processor, Prompts(), t), list(t.images)
        answer = tok.encode(colour_answer_turn(t.answers[0]), add_special_tokens=False)
        colour_rows.append(
            1.0
            / (1.0 + math.exp(_logprob(scorer, prompt, answer, images) - _logprob(scorer, prompt, search_ids, images)))
        )
    n, m = max(1, len(rows)), max(1, len(colour_rows))
    return {
        "colour_p_search": sum(colour_rows) / m,
        "colour_greedy_search": sum(p > 0.5 for p in colour_rows) / m,
        "questions": float(len(rows)),
        "p_search": sum(r[0] for r in rows) / n,
        "greedy_search": sum(r[0] > 0.5 for r in rows) / n,
        "p_right_colour": sum(r[1] for r in rows) / n,
        "p_city_given_colour": sum(r[2] for r in rows) / n,
        "wrong_colour_mass_on_shown_results": sum(r[3] for r in rows) / n,
        "expected_sampled_accuracy": sum(r[0] * r[1] * r[2] for r in rows) / n,
    }


def _logprob(scorer: Scorer, prefix: list[int], continuation: list[int], images: list) -> float:
    positions = list(range(len(prefix), len(prefix) + len(continuation)))
    probs = scorer.probs(prefix + continuation, images, positions)
    return sum(math.log(max(1e-30, float(p[t]))) for p, t in zip(probs, continuation))


def train(
    model,
    image_inputs,
    streams: list[tuple[list, int]],
    cfg,
    seed: int,
    pad_id: int,
    check: Callable[[int], bool] | None = None,
    check_every: int = 0,
) -> list[float]:
    """The shared warm-start loop (`assets/core/sft.py`): `cfg.steps` steps on one batch of each (trajectories or
    examples, batch size) stream (stream i shuffled with seed + i), loss on their mask-1 tokens, images through the
    processor's `image_inputs` (a batch without images is text only)."""
    built = [
        Stream([e if isinstance(e, SFTExample) else SFTExample.from_trajectory(e) for e in items], size, seed + i)
        for i, (items, size) in enumerate(streams)
    ]

    def vision_inputs(ids, images):  # transformers 5: without modality ids the positions are text-only
        return {**image_inputs.batch(images), "mm_token_type_ids": mm_token_type_ids(ids, model.config.image_token_id)}

    return sft_loop.train(
        model,
        built,
        cfg,
        pad_id,
        vision_inputs=vision_inputs,
        progress=False,
        desc="mm warm-start SFT",
        logits_on_targets=True,
        check=check,
        check_every=check_every,
    )


@dataclass
class PhaseRecord:
    steps: int
    cpu_seconds: float
    curve: list[tuple[int, float]]
    last_loss: float


def _phase(model, images, streams, cfg, seed, pad, log, name, gate=None, measure=None) -> PhaseRecord:
    curve: list[tuple[int, float]] = []
    cpu0 = time.process_time()

    def check(steps: int) -> bool:
        figure = measure()
        curve.append((steps, round(figure, 4)))
        log(f"mm warm start, {name}: step {steps}, gate figure {figure:.3f} (gate {gate})")
        return figure >= gate

    losses = train(
        model,
        images,
        streams,
        cfg,
        seed,
        pad,
        check=check if measure else None,
        check_every=cfg.check_every if measure else 0,
    )
    if measure is not None and (not curve or curve[-1][1] < gate):
        raise RuntimeError(
            f"the mm warm start's {name} phase missed its gate ({gate}) within {cfg.steps} steps: "
            f"gate curve {curve}. Grow the model (SFTConfig.shape) or the phase's budget."
        )
    return PhaseRecord(
        len(losses),
        round(time.process_time() - cpu0, 1),
        curve,
        round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4),
    )


# The warm-start gate on the held-out questions (`probe_city_questions`): (figure, lowest, highest). City questions:
# greedy decoding gives up (search_required starts low), sampling searches often enough for GRPO to see mixed
# groups, and after a search the title is read. Colour questions: greedy decoding still over-searches, so the
# search penalty has a lesson to teach (search_free).
GATE = (
    ("greedy_search", 0.0, 0.35),
    ("p_search", 0.10, 0.45),
    ("p_city_given_colour", 0.8, 1.0),
    ("expected_sampled_accuracy", 0.05, 0.45),
    ("colour_greedy_search", 0.3, 1.0),
)


def gate_verdict(figures: dict[str, float]) -> dict[str, bool]:
    return {key: low <= figures[key] <= high for key, low, high in GATE}


def build_mm_sft_model(root: Path, seed: int, log: Callable[..., None], cfg: SFTConfig | None = None) -> dict:
    """Train `mm/models/qwen2.5-vl-tiny-sft` on the train split; returns (and saves) a report."""
    import torch

    cfg = cfg or SFTConfig()
    torch.set_num_threads(cfg.threads)
    paths = layout(root)
    corpus = root / "corpus" / "wiki.jsonl"
    processor = load_vl_processor(paths.processor_dir)
    tok, pad = processor.tokenizer, processor.tokenizer.pad_token_id
    specs = {c: EmblemSpec(**s) for c, s in json.loads(paths.emblems.read_text()).items()}
    scripted = load_scripted_paths(paths.train_paths)
    test_scripted = load_scripted_paths(paths.test_paths)
    heldout = {p["city"] for p in test_scripted.values()}
    tasks = [Task.from_row(r) for r in read_fvqa(paths.fvqa_train, PX, PX)]
    t0 = time.perf_counter()
    plans = demonstration_plans(tasks, scripted, paths.cache_train, specs, heldout, cfg, seed)
    trajs = play_back(processor, plans, paths.cache_train, corpus, cfg)
    model = vl_models.make_qwen2_5_vl(tok, cfg.shape, seed + 21)
    images = ImageInputs(processor.image_processor, capacity=8192)
    train_cities = sorted({p["city"] for p in scripted.values()})
    colour = colour_examples(processor, specs, train_cities, cfg.colour_images_per_city, seed + 23)
    names = _name_words(tok)
    name_ids = list(word_ids(tok, names).values())
    prefixes = prompt_prefixes(processor, specs, seed + 30)
    rng = random.Random(seed + 25)
    induction = [induction_example(rng, name_ids, set()) for _ in range(cfg.induction_batch_size * 400)]
    in_context = [
        in_prompt(induction_example(rng, name_ids, set()), rng, prefixes) for _ in range(cfg.induction_batch_size * 200)
    ]
    probe_rng = random.Random(seed + 26)
    induction_probe = [induction_example(probe_rng, name_ids, set()) for _ in range(64)]
    in_context_probe = [
        in_prompt(induction_example(probe_rng, name_ids, set()), probe_rng, prefixes) for _ in range(32)
    ]
    with tempfile.TemporaryDirectory(prefix="mm-reading-") as tmp:
        reading, overlap = reading_plans(names, cfg.reading_examples + 100, specs, heldout, Path(tmp), seed + 27)
        reading_trajs = play_back(processor, reading, Path(tmp), corpus, cfg)
    reading_train, reading_probe = reading_trajs[: cfg.reading_examples], reading_trajs[cfg.reading_examples :]
    scorer = Scorer(model, processor)
    gated = replace(cfg, lr=cfg.induction_lr, schedule="constant")
    # induction first, on bare runs and the random model (after the colour phase, or inside the loop's long
    # prompts, the head had not formed in 1,400 steps), then inside a question's prompt and image
    phases = {
        "induction": _phase(
            model,
            images,
            [(induction, cfg.induction_batch_size)],
            replace(gated, steps=cfg.induction_max_steps),
            seed + 28,
            pad,
            log,
            "induction",
            cfg.induction_gate,
            lambda: induction_accuracy(scorer, induction_probe),
        )
    }
    phases["induction_in_prompts"] = _phase(
        model,
        images,
        [(in_context, cfg.induction_batch_size - cfg.induction_replay), (induction, cfg.induction_replay)],
        replace(gated, steps=cfg.induction_max_steps),
        seed + 31,
        pad,
        log,
        "induction in prompts",
        cfg.induction_gate,
        lambda: induction_accuracy(scorer, in_context_probe),
    )
    phases["colour"] = _phase(
        model,
        images,
        [(colour, cfg.colour_batch_size), (in_context, cfg.induction_replay)],
        replace(cfg, steps=cfg.colour_steps),
        seed + 24,
        pad,
        log,
        "colour",
    )
    phases["reading"] = _phase(
        model,
        images,
        [(reading_train, cfg.reading_batch_size), (in_context, cfg.induction_replay), (colour, cfg.colour_replay)],
        replace(gated, steps=cfg.reading_max_steps),
        seed + 29,
        pad,
        log,
        "reading",
        cfg.reading_gate,
        lambda: reading_probability(scorer, processor, reading_probe),
    )
    colour_trajs = [t for t, p in zip(trajs, plans) if p.kind.startswith("colour")]
    city_trajs = [t for t, p in zip(trajs, plans) if not p.kind.startswith("colour")]
    phases["trajectories"] = _phase(
        model,
        images,
        [
            (city_trajs, cfg.batch_size),
            (colour_trajs, cfg.colour_trajectory_batch_size),
            (colour, cfg.colour_replay),
            ([final_turn_only(t) for t in reading_train], cfg.reading_replay),
            (in_context, 2),
        ],
        cfg,
        seed + 22,
        pad,
        log,
        "trajectories",
    )
    out = paths.qwen2_5_vl_tiny_sft
    vl_models.save_vl_model(model, processor, out)
    test_tasks = [Task.from_row(r) for r in read_fvqa(paths.fvqa_test, PX, PX)]
    probe = probe_city_questions(scorer, processor, test_tasks, test_scripted, paths.cache_test, corpus, specs, cfg)
    kinds = {k: sum(p.kind == k for p in plans) for k in sorted({p.kind for p in plans})}
    verdict = gate_verdict(probe)
    report = {
        "config": {**asdict(cfg), "shape": asdict(cfg.shape)},
        "trajectories": len(trajs),
        "plans": kinds,
        "phases": {k: asdict(v) for k, v in phases.items()},
        "heldout_emblem_overlap": overlap,
        "heldout_city_probe": probe,
        "gate": verdict,
        "gate_passed": all(verdict.values()),
        "train_seconds": round(time.perf_counter() - t0, 1),
        "train_cpu_seconds": round(sum(p.cpu_seconds for p in phases.values()), 1),
    }
    (out / "sft_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(
        f"mm sft: {len(trajs)} trajectories {kinds}, phases "
        + ", ".join(f"{k} {v.steps} steps ({v.cpu_seconds} CPU s)" for k, v in phases.items())
        + f" in {report['train_seconds']}s; held-out city probe: "
        + ", ".join(f"{k} {v:.3f}" for k, v in probe.items())
        + f"; gate {'passed' if report['gate_passed'] else 'MISSED: ' + str(verdict)} -> {out}"
    )
    return report


def _name_words(tokenizer) -> list[str]:
    """The one-token names the VL tokenizer was given (`assets/mmsearch/tiny.py`): capitalised added words."""
    return sorted(t.strip() for t in tokenizer.get_added_vocab() if t.startswith(" ") and t.strip()[:1].isupper())


def manifest_entry(root: Path) -> dict:
    """What MANIFEST.json records of the VL warm start: the split check and the gate on the held-out questions."""
    report = json.loads((layout(root).qwen2_5_vl_tiny_sft / "sft_report.json").read_text())
    return {
        "heldout_emblem_overlap": report["heldout_emblem_overlap"],
        "warm_start_gate": {k: report["heldout_city_probe"][k] for k, _, _ in GATE},
        "warm_start_gate_passed": report["gate_passed"],
    }
