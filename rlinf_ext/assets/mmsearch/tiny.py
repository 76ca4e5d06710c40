"""The tiny offline multimodal world (`make-tiny-assets --with-mm`), built on the text world's seed.

Writes under `<root>/mm/`: emblem specs, FVQA-format train/test parquet (colour and city questions), the image-search
cache in the FVQA_Cache layout for both splits plus the test split as an official-layout pickle, the control runs'
caches (`paths.CONTROLS`), a VL tokenizer + processor (every city name and reading-phase name one token), and a
random tiny Qwen2.5-VL. Test questions use held-out cities (never an answer in training) and fresh jitters.
Deterministic for a seed; no network.
"""

from __future__ import annotations

import io
import json
import pickle
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from rlinf_ext.agent.mmsearch.prompts import Prompts
from rlinf_ext.assets.core import corpus as corpus_mod
from rlinf_ext.assets.core.tokenizer import add_word_tokens
from rlinf_ext.assets.core.world import NameMaker, build_world
from rlinf_ext.assets.mmsearch import models as vl_models
from rlinf_ext.assets.mmsearch.paths import ABLATED, TITLES_PERMUTED, layout
from rlinf_ext.assets.mmsearch.trajectories import give_up_turn, scripted_turns
from rlinf_ext.assets.mmsearch.world import (
    PALETTE,
    EmblemSpec,
    Question,
    ablated_hits,
    draw_emblem,
    emblem_specs,
    permuted_titles,
    questions_for,
    search_hits,
    split_cities,
)
from rlinf_ext.data.fvqa import FVQARow, write_fvqa
from rlinf_ext.protocol.images import canonicalize, encode_png

TRAIN_PASSES = 4  # each train city is asked about four times per kind, with fresh jitters and searches
TEST_PASSES = 3  # each held-out city three times per kind: 60 city and 60 colour questions
SEARCH_TOPK = 3
# extra one-token city names for the warm start's title-reading phase (fresh pairings). The induction phase needs a
# large pool: with the world's 72 cities plus 600 names (672) the VL model's induction head had not formed after
# 1,500 steps (loss 5.0-5.5); with 2,072 it formed at ~600 steps (loss 4.5 -> 0.8 within 50 steps), as the text
# world's 1,696 names do at ~650
READING_NAMES = 2000


def _canonical(image):
    return canonicalize(image, vl_models.TINY_MIN_PIXELS, vl_models.TINY_MIN_PIXELS)


def _questions(specs, cities: list[str], passes: int, rng: random.Random) -> list[Question]:
    out = [q for _ in range(passes) for c in cities for q in questions_for(specs, c)]
    rng.shuffle(out)
    return out


def reading_names(world, seed: int, n: int = READING_NAMES) -> list[str]:
    """Names no entity of the world has, for the title-reading phase's fresh pairings."""
    maker = NameMaker(random.Random(seed + 14))
    maker.used |= {c.lower() for c in world.cities}
    return [maker.word(2, 3) for _ in range(n)]


def _write_cache(folder: Path, titles: list[str], thumbs: list) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").write_text(json.dumps({"title_list": titles, "image_urls": [None] * len(titles)}) + "\n")
    for rank, thumb in enumerate(thumbs):
        (folder / f"img_{rank:03d}.png").write_bytes(encode_png(thumb))


def _write_split(
    name: str,
    questions: list[Question],
    specs: dict[str, EmblemSpec],
    rng: random.Random,
    fvqa_path: Path,
    cache_root: Path,
    controls: dict[str, Path],
    paths_file: Path,
) -> tuple[list[FVQARow], dict]:
    """FVQA rows plus each question's cached image search (directory layout; ``controls``: the control runs'
    caches) and scripted path (jsonl); returns rows and pickle entries."""
    rows, entries, scripted = [], {}, []
    for i, q in enumerate(questions):
        data_id = f"tinymm_{name}_{i:04d}"
        image = _canonical(draw_emblem(specs[q.city], rng))
        rows.append(
            FVQARow(data_id, q.question, [image], q.answers[0], list(q.answers[1:]), q.category, f"tinymm_{q.kind}")
        )
        hits = search_hits(specs, q.city, rng, SEARCH_TOPK)
        thumbs = [draw_emblem(h, rng) for h in hits]
        _write_cache(cache_root / data_id, [h.title for h in hits], thumbs)
        entries[data_id] = (hits, thumbs)
        ablated = ablated_hits(specs, q.city, rng, SEARCH_TOPK)
        _write_cache(controls[ABLATED] / data_id, [h.title for h in ablated], [draw_emblem(h, rng) for h in ablated])
        _write_cache(controls[TITLES_PERMUTED] / data_id, permuted_titles(hits, rng), thumbs)
        scripted.append({"data_id": data_id, "kind": q.kind, "city": q.city})
    write_fvqa(rows, fvqa_path)
    paths_file.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in scripted))
    return rows, entries


def write_cache_pickle(entries: dict, path: Path) -> None:
    """The official layout: titles plus thumbnails as pickled PIL `PngImageFile` objects."""
    from PIL import Image

    data = {}
    for data_id, (hits, thumbs) in entries.items():
        files = [Image.open(io.BytesIO(encode_png(t))) for t in thumbs]
        for f in files:
            f.load()
        data[data_id] = {"tool_returned_web_title_list": [h.title for h in hits], "tool_returned_images_urls": files}
    path.write_bytes(pickle.dumps(data, protocol=4))


def _tokenizer_texts(world, seed: int, questions: list[Question], specs) -> list[str]:
    """What the VL BPE learns from (names aside: they are added as whole tokens)."""
    prompts = Prompts()
    passages = [p.contents for p in corpus_mod.build_passages(world, seed)]
    turns = ["".join(scripted_turns(q, search_colour=True, restated=specs[q.city])) for q in questions]
    frames = [
        prompts.round_1,
        prompts.after_image_search,
        prompts.after_text_search,
        prompts.image_results_header,
        prompts.text_results_header,
        prompts.search_failed,
        give_up_turn(),
    ] * 20
    titles = [s.title for s in specs.values()]
    return (
        passages
        + [q.question for q in questions]
        + turns
        + frames
        + titles * 3
        + ["system\nYou are a helpful assistant.\nuser\nassistant\n"] * 20
    )


def generate_mm(root: Path, seed: int, log: Callable[..., None]) -> dict[str, float]:
    """Write the multimodal world under `root/mm`; returns seconds per stage."""
    t0 = time.perf_counter()
    paths = layout(root)
    world = build_world(seed)
    specs = emblem_specs(world, seed)
    train_cities, test_cities = split_cities(world, seed)
    rng = random.Random(seed + 13)
    train_q = _questions(specs, train_cities, TRAIN_PASSES, rng)
    test_q = _questions(specs, test_cities, TEST_PASSES, rng)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.emblems.write_text(json.dumps({c: asdict(s) for c, s in specs.items()}, indent=1, sort_keys=True) + "\n")
    _write_split(
        "train",
        train_q,
        specs,
        rng,
        paths.fvqa_train,
        paths.cache_train,
        {c: paths.control_cache("train", c) for c in (ABLATED, TITLES_PERMUTED)},
        paths.train_paths,
    )
    _, test_entries = _write_split(
        "test",
        test_q,
        specs,
        rng,
        paths.fvqa_test,
        paths.cache_test,
        {c: paths.control_cache("test", c) for c in (ABLATED, TITLES_PERMUTED)},
        paths.test_paths,
    )
    write_cache_pickle(test_entries, paths.cache_test_pickle)
    log(
        f"mm data: {len(train_q)} train / {len(test_q)} test questions ({len(train_cities)} / {len(test_cities)} "
        f"cities), image-search caches -> {paths.root}"
    )
    t1 = time.perf_counter()
    tokenizer = vl_models.train_vl_tokenizer(_tokenizer_texts(world, seed, train_q + test_q, specs))
    # city names, reading-phase names and colour words one token each: reading a title is copying the one token
    # after the colour word
    add_word_tokens(tokenizer, sorted(world.cities) + reading_names(world, seed) + list(PALETTE))
    processor = vl_models.make_processor(tokenizer)
    processor.save_pretrained(str(paths.processor_dir))
    model = vl_models.make_qwen2_5_vl(tokenizer, vl_models.TinyVLShape(), seed)
    vl_models.save_vl_model(model, processor, paths.qwen2_5_vl_tiny)
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"mm model: qwen2.5-vl-tiny ({n_params:,} params, vocab {model.config.text_config.vocab_size}, tokenizer {len(tokenizer)})"
    )
    t2 = time.perf_counter()
    return {"mm_data": round(t1 - t0, 2), "mm_models": round(t2 - t1, 2)}
