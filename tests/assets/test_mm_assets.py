"""The tiny multimodal world: emblems, FVQA files, image-search caches, VL tokenizer/processor, tiny model."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from collections import Counter

import pytest

from rlinf_ext.agent.mmsearch.types import Task
from rlinf_ext.assets.core.world import build_world
from rlinf_ext.assets.mmsearch.sft import SFTConfig, colour_openings_per_step, plan_for, searching_colour_ids
from rlinf_ext.assets.mmsearch.trajectories import IMAGE_SEARCH_TURN, answer_turn
from rlinf_ext.assets.mmsearch.world import PALETTE, draw_emblem, emblem_specs, search_hits, split_cities
from rlinf_ext.config.schema import ImageSearchToolConfig
from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.tools.image_search import ImageSearchTool

PX = 56 * 56


def test_world_emblems_questions_and_hits():
    world = build_world(0)
    specs = emblem_specs(world, 0)
    assert set(specs) == set(world.cities)
    counts = Counter(s.colour for s in specs.values())
    assert set(counts) == set(PALETTE) and max(counts.values()) - min(counts.values()) <= 1
    train, test = split_cities(world, 0)
    assert not set(train) & set(test) and not (set(train) | set(test)) & world.distractor_cities
    rng = random.Random(1)
    ranks = []
    for city in train:
        hits = search_hits(specs, city, rng)
        titles = [h.title for h in hits]
        assert len(hits) == 3 and specs[city].title in titles
        assert sum(h.colour == specs[city].colour for h in hits) >= 2  # a same-colour distractor
        ranks.append(titles.index(specs[city].title))
    assert set(ranks) == {0, 1}  # the true page is not always first: titles must be read
    a, b = draw_emblem(specs[train[0]], random.Random(0)), draw_emblem(specs[train[0]], random.Random(1))
    assert a.size == (56, 56) and a.tobytes() != b.tobytes()  # independent jitters


def test_warm_start_mix_searches_first_on_an_exact_share_of_the_colour_questions():
    """10 colour, 4 city and 4 attribute questions at over_search 0.7, counted by hand: 7 colour paths search
    first and 3 answer directly; every city and attribute path searches first. Searched or not, a colour path
    ends with the same answer naming the gold colour."""
    scripted = {f"colour{i}": {"kind": "colour", "city": "Avel", "query": None} for i in range(10)}
    scripted |= {f"city{i}": {"kind": "city", "city": "Avel", "query": None} for i in range(4)}
    scripted |= {f"attr{i}": {"kind": "attribute", "city": "Avel", "query": "founder of Avel"} for i in range(4)}
    searching = searching_colour_ids(scripted, 0.7, seed=3)
    assert len(searching) == 7 and all(i.startswith("colour") for i in searching)
    assert searching_colour_ids(scripted, 0.7, seed=3) == searching  # seeded
    assert searching_colour_ids(scripted, 0.0, seed=3) == set()
    assert len(searching_colour_ids(scripted, 1.0, seed=3)) == 10
    gold = {"colour": "blue", "city": "Avel", "attribute": "Brena"}
    first_turns, colour_endings = Counter(), set()
    for data_id, path in scripted.items():
        task = Task(data_id, "q?", (), (gold[path["kind"]],), "", "")
        plan = plan_for(task, path, data_id in searching)
        first_turns[path["kind"], "search" if plan[0] == IMAGE_SEARCH_TURN else "direct"] += 1
        if path["kind"] == "colour":
            colour_endings.add(plan[-1])
    assert first_turns == {("colour", "search"): 7, ("colour", "direct"): 3, ("city", "search"): 4,
                           ("attribute", "search"): 4}
    assert colour_endings == {answer_turn("The emblem is blue.", "blue")}
    with pytest.raises(ValueError, match="over_search must be a share"):
        searching_colour_ids(scripted, 1.5, seed=3)


def test_warm_start_colour_answers_per_step_direct_and_search_first():
    """Phase B's colour answers per step, by hand. The default mix on the tiny world's 276 train trajectories (92
    colour ones, all searching first): 8 * 92/276 = 2.67 search-first colour answers and 0 + 2 replayed direct
    ones. At over_search 0.7 without replay (64 of 92 search first): 8 * 28/276 = 0.81 direct, 8 * 64/276 = 1.86."""
    cfg = SFTConfig()
    assert (cfg.batch_size, cfg.colour_replay) == (8, 2)
    assert len(searching_colour_ids({f"c{i}": {"kind": "colour"} for i in range(92)}, cfg.over_search, seed=0)) == 92
    direct, search_first = colour_openings_per_step(cfg, 276, 92, 92)
    assert direct == 2.0 and search_first == pytest.approx(8 / 3)
    direct, search_first = colour_openings_per_step(SFTConfig(over_search=0.7, colour_replay=0), 276, 92, 64)
    assert direct == pytest.approx(8 * 28 / 276) and search_first == pytest.approx(8 * 64 / 276)


def test_fvqa_files_kinds_and_held_out_cities(tiny_mm_assets):
    mm = tiny_mm_assets.mm
    train = read_fvqa(mm.fvqa_train, PX, PX)
    test = read_fvqa(mm.fvqa_test, PX, PX)
    kinds = Counter(r.data_source for r in train)
    assert set(kinds) == {"tinymm_colour", "tinymm_city", "tinymm_attribute"} and len(set(kinds.values())) == 1
    assert Counter(r.category for r in test) == {"search_required": 24, "search_free": 12}
    assert all(len(r.images) == 1 and (r.images[0].width, r.images[0].height) == (56, 56) for r in train + test)
    specs = json.loads(mm.emblems.read_text())
    train_cities = {r.golds[0] for r in train if r.data_source == "tinymm_city"}
    test_cities = {r.golds[0] for r in test if r.data_source == "tinymm_city"}
    assert test_cities and not train_cities & test_cities and test_cities <= set(specs)
    colour_rows = [r for r in test if r.category == "search_free"]
    assert all(r.golds[0] in PALETTE for r in colour_rows)


def test_caches_agree_between_directory_and_pickle(tiny_mm_assets):
    mm = tiny_mm_assets.mm
    test = read_fvqa(mm.fvqa_test, PX, PX)
    common = dict(topk=3, thumbnail_min_pixels=PX, thumbnail_max_pixels=PX)
    by_dir = ImageSearchTool(ImageSearchToolConfig(backend="cache_dir", cache_path=str(mm.cache_test), **common))
    by_pkl = ImageSearchTool(ImageSearchToolConfig(backend="cache_pickle", cache_path=str(mm.cache_test_pickle), **common))

    async def both():
        return [(await by_dir.search(r.data_id), await by_pkl.search(r.data_id)) for r in test]

    specs = json.loads(mm.emblems.read_text())
    for row, (d, p) in zip(test, asyncio.run(both())):
        assert d.ok and p.ok and [h.title for h in d.hits] == [h.title for h in p.hits]
        assert [h.image.to_pil().tobytes() for h in d.hits] == [h.image.to_pil().tobytes() for h in p.hits]
        if row.data_source == "tinymm_city":
            city = row.golds[0]
            assert f"Emblem of {city} - {specs[city]['country']}" in [h.title for h in d.hits]
    assert by_dir.stats.misses == 0 and by_pkl.stats.missing_images == 0
    train_ids = [r.data_id for r in read_fvqa(mm.fvqa_train, PX, PX)]
    assert sorted(p.name for p in mm.cache_train.iterdir()) == sorted(train_ids)


def test_vl_stack_builds_saves_reloads_and_generates(tiny_mm_assets):
    import torch
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLForConditionalGeneration

    from rlinf_ext.generation.hf_vl import load_vl_processor

    mm = tiny_mm_assets.mm
    # saved under the stock names (AutoProcessor loads it where torchvision exists); loaded here without a video
    # processor, which transformers 5 builds only with torchvision (generation/vl_processor.py)
    saved = json.loads((mm.qwen2_5_vl_tiny / "processor_config.json").read_text())
    assert saved["processor_class"] == "Qwen2_5_VLProcessor"
    assert saved["image_processor"]["image_processor_type"] == "Qwen2VLImageProcessor"
    processor = load_vl_processor(mm.qwen2_5_vl_tiny)
    assert isinstance(processor, __import__("transformers").Qwen2_5_VLProcessor)
    assert type(processor.tokenizer).__name__ in ("Qwen2TokenizerFast", "Qwen2Tokenizer")
    assert type(processor.image_processor).__name__.startswith("Qwen2VLImageProcessor")
    config = json.loads((mm.qwen2_5_vl_tiny / "config.json").read_text())
    rope = config["text_config"]["rope_parameters"]  # transformers 5: rope_scaling folded into rope_parameters
    assert rope["mrope_section"] == [2, 3, 3] and rope["rope_type"] == "default"
    assert config["text_config"]["vocab_size"] > len(processor.tokenizer)  # padded rows exist (and are banned at sampling)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(mm.qwen2_5_vl_tiny, dtype=torch.float32)
    assert type(AutoModelForImageTextToText.from_pretrained(mm.qwen2_5_vl_tiny)).__name__ == type(model).__name__
    row = read_fvqa(mm.fvqa_test, PX, PX)[0]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": row.question}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=[text], images=[row.images[0].to_pil()], return_tensors="pt")  # + mm_token_type_ids
    assert inputs.image_grid_thw.tolist() == [[1, 4, 4]] and int(inputs.mm_token_type_ids.sum()) == 4
    assert int((inputs.input_ids == model.config.image_token_id).sum()) == 4
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == inputs.input_ids.shape[1] + 5 or int(out[0, -1]) in model.generation_config.eos_token_id


def test_mm_world_is_added_to_an_existing_directory_and_is_deterministic(tiny_mm_assets, tmp_path):
    from rlinf_ext.assets.core.tiny import make_tiny_assets, read_manifest

    out = tmp_path / "assets"
    shutil.copytree(tiny_mm_assets.root, out, ignore=shutil.ignore_patterns("mm", "MANIFEST.json"))
    base_manifest = {k: v for k, v in read_manifest(tiny_mm_assets.root).items() if k != "mm_version"}
    base_manifest["files"] = {k: v for k, v in base_manifest["files"].items() if not k.startswith("mm/")}
    (out / "MANIFEST.json").write_text(json.dumps(base_manifest))
    assets = make_tiny_assets(out, seed=0, with_mm=True)
    rebuilt, original = read_manifest(out)["files"], read_manifest(tiny_mm_assets.root)["files"]

    def world(files):  # the world and the random model (a session may also hold the warm start)
        return {k: v for k, v in files.items() if k.startswith("mm/") and "qwen2.5-vl-tiny-sft" not in k}

    assert assets.mm is not None and world(rebuilt) == world(original) and len(world(rebuilt)) > 1000
    assert make_tiny_assets(out, seed=0).mm is not None  # reused, mm kept
