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
from rlinf_ext.assets.mmsearch.paths import ABLATED, TITLES_PERMUTED
from rlinf_ext.assets.mmsearch.sft import SFTConfig, demonstration_plans, searching_colour_ids
from rlinf_ext.assets.mmsearch.trajectories import IMAGE_SEARCH_TURN, answer_turn, city_answer_turn, give_up_turn
from rlinf_ext.assets.mmsearch.world import (
    PALETTE,
    ablated_hits,
    draw_emblem,
    emblem_specs,
    parse_title,
    permuted_titles,
    search_hits,
    split_cities,
    title_of,
)
from rlinf_ext.config.schema import ImageSearchToolConfig
from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.tools.image_search import ImageSearch

PX = 56 * 56


def test_world_emblems_questions_and_hits():
    world = build_world(0)
    specs = emblem_specs(world, 0)
    assert set(specs) == set(world.cities)
    counts = Counter(s.colour for s in specs.values())
    assert set(counts) == set(PALETTE) and max(counts.values()) - min(counts.values()) <= 1
    train, test = split_cities(world, 0)
    assert len(test) == 20 and not set(train) & set(test) and not (set(train) | set(test)) & world.distractor_cities
    rng = random.Random(1)
    ranks = Counter()
    for city in train * 20:
        hits = search_hits(specs, city, rng)
        assert len(hits) == 3 and specs[city] in hits
        assert len({h.colour for h in hits}) == 3  # distractors of other, distinct colours
        ranks[hits.index(specs[city])] += 1
        ablated = ablated_hits(specs, city, rng)
        assert city not in [h.city for h in ablated] and specs[city].colour not in [h.colour for h in ablated]
    assert set(ranks) == {0, 1, 2} and min(ranks.values()) > 0.28 * sum(ranks.values())  # rank carries no signal
    a, b = draw_emblem(specs[train[0]], random.Random(0)), draw_emblem(specs[train[0]], random.Random(1))
    assert a.size == (56, 56) and a.tobytes() != b.tobytes()  # independent jitters


def test_titles_put_the_city_right_after_the_colour_and_the_permutation_keeps_colours():
    assert title_of("red", "Trestias") == "red Trestias emblem" and parse_title("red Trestias emblem") == (
        "red",
        "Trestias",
    )
    specs = emblem_specs(build_world(0), 0)
    hits = search_hits(specs, sorted(specs)[0], random.Random(2))
    kept = Counter()
    for seed in range(300):
        titles = permuted_titles(hits, random.Random(seed))
        assert [parse_title(t)[0] for t in titles] == [h.colour for h in hits]  # each thumbnail keeps its colour
        assert sorted(parse_title(t)[1] for t in titles) == sorted(h.city for h in hits)
        kept[sum(parse_title(t)[1] == h.city for t, h in zip(titles, hits))] += 1
    assert 0.25 < sum(n * k for k, n in kept.items()) / (3 * 300) < 0.42  # a title keeps its city 1 time in 3


def test_warm_start_demonstrations_have_the_same_mix_for_every_question(tmp_path):
    """4 colour and 3 city questions, counted by hand: over_search 0.5 searches first on 2 colour questions; each
    city question gets 10 demonstrations, 7 giving up, 2 restating its true result, 1 another result's (never a
    held-out city's: with both other results held out it restates the true one instead)."""
    import json as json_

    specs = emblem_specs(build_world(0), 0)
    cities = sorted(specs)[:5]
    scripted, tasks = {}, []
    for i in range(4):
        scripted[f"colour{i}"] = {"kind": "colour", "city": cities[0]}
        tasks.append(Task(f"colour{i}", "What colour?", (), (specs[cities[0]].colour,)))
    results = {
        "city0": cities[0:3],
        "city1": [cities[1], cities[3], cities[4]],
        "city2": [cities[2], cities[3], cities[4]],
    }
    for data_id, shown in results.items():
        scripted[data_id] = {"kind": "city", "city": shown[0]}
        tasks.append(Task(data_id, "Which city?", (), (shown[0],)))
        (tmp_path / data_id).mkdir()
        (tmp_path / data_id / "meta.json").write_text(json_.dumps({"title_list": [specs[c].title for c in shown]}))
    heldout = {cities[3], cities[4]}
    cfg = SFTConfig(over_search=0.5, city_demonstrations=10, city_give_up_share=0.7, city_right_share=2 / 3)
    plans = demonstration_plans(tasks, scripted, tmp_path, specs, heldout, cfg, seed=0)
    kinds = Counter((p.task.data_id, p.kind) for p in plans)
    assert sum(n for (d, k), n in kinds.items() if k == "colour_search") == 2
    assert sum(n for (d, k), n in kinds.items() if k == "colour_direct") == 2
    assert kinds[("city0", "city_give_up")] == 7 and kinds[("city0", "city_right")] == 2
    assert kinds[("city0", "city_other")] == 1
    assert kinds[("city1", "city_right")] == 3 and kinds[("city1", "city_other")] == 0  # its others are held out
    for p in plans:
        if p.kind == "city_give_up":
            assert p.turns == [give_up_turn()]
        elif p.kind == "city_right":
            assert p.turns == [IMAGE_SEARCH_TURN, city_answer_turn(specs[scripted[p.task.data_id]["city"]])]
        elif p.kind == "city_other":
            assert p.turns[1] == answer_turn(f"{specs[cities[1]].colour} {cities[1]}", cities[1]) or p.turns[
                1
            ] == answer_turn(f"{specs[cities[2]].colour} {cities[2]}", cities[2])
    assert searching_colour_ids(scripted, 0.5, seed=0) == {p.task.data_id for p in plans if p.kind == "colour_search"}
    with pytest.raises(ValueError, match="over_search must be a share"):
        searching_colour_ids(scripted, 1.5, seed=3)


def test_fvqa_files_kinds_and_held_out_cities(tiny_mm_assets):
    mm = tiny_mm_assets.mm
    train = read_fvqa(mm.fvqa_train, PX, PX)
    test = read_fvqa(mm.fvqa_test, PX, PX)
    kinds = Counter(r.data_source for r in train)
    assert set(kinds) == {"tinymm_colour", "tinymm_city"} and len(set(kinds.values())) == 1
    assert Counter(r.category for r in test) == {"search_required": 60, "search_free": 60}
    assert all(len(r.images) == 1 and (r.images[0].width, r.images[0].height) == (56, 56) for r in train + test)
    specs = json.loads(mm.emblems.read_text())
    train_cities = {r.golds[0] for r in train if r.data_source == "tinymm_city"}
    test_cities = {r.golds[0] for r in test if r.data_source == "tinymm_city"}
    assert len(test_cities) == 20 and not train_cities & test_cities and test_cities <= set(specs)
    colour_rows = [r for r in test if r.category == "search_free"]
    assert all(r.golds[0] in PALETTE for r in colour_rows)


def test_caches_agree_between_directory_and_pickle_and_the_controls(tiny_mm_assets):
    mm = tiny_mm_assets.mm
    test = read_fvqa(mm.fvqa_test, PX, PX)
    common = dict(topk=3, thumbnail_min_pixels=PX, thumbnail_max_pixels=PX)

    def tool(backend, path):
        return ImageSearch(ImageSearchToolConfig(backend=backend, cache_path=str(path), **common))

    by_dir, by_pkl = tool("cache_dir", mm.cache_test), tool("cache_pickle", mm.cache_test_pickle)
    ablated, permuted = (
        tool("cache_dir", mm.control_cache("test", ABLATED)),
        tool("cache_dir", mm.control_cache("test", TITLES_PERMUTED)),
    )

    async def every():
        return [[await t.run(r.data_id) for t in (by_dir, by_pkl, ablated, permuted)] for r in test]

    specs = json.loads(mm.emblems.read_text())
    for row, (d, p, a, t) in zip(test, asyncio.run(every())):
        assert d.ok and p.ok and [h.title for h in d.hits] == [h.title for h in p.hits]
        assert [h.image.to_pil().tobytes() for h in d.hits] == [h.image.to_pil().tobytes() for h in p.hits]
        city = row.golds[0] if row.data_source == "tinymm_city" else None
        if city:
            assert title_of(specs[city]["colour"], city) in [h.title for h in d.hits]
            assert city not in " ".join(h.title for h in a.hits)  # nothing usable
        # the permuted titles: same thumbnails, same colours in the same places, the cities shuffled
        assert [h.image.to_pil().tobytes() for h in t.hits] == [h.image.to_pil().tobytes() for h in d.hits]
        assert [parse_title(h.title)[0] for h in t.hits] == [parse_title(h.title)[0] for h in d.hits]
    assert by_dir.stats.failures == 0 and by_pkl.missing_images == 0
    train_ids = [r.data_id for r in read_fvqa(mm.fvqa_train, PX, PX)]
    assert sorted(p.name for p in mm.cache_train.iterdir()) == sorted(train_ids)
    assert sorted(p.name for p in mm.control_cache("train", ABLATED).iterdir()) == sorted(train_ids)


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
    assert config["text_config"]["vocab_size"] > len(
        processor.tokenizer
    )  # padded rows exist (and are banned at sampling)
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


def test_vl_gate_verdict_reads_each_bound():
    from rlinf_ext.assets.mmsearch.sft import gate_verdict

    good = {
        "greedy_search": 0.0,
        "p_search": 0.3,
        "p_city_given_colour": 0.9,
        "expected_sampled_accuracy": 0.25,
        "colour_greedy_search": 0.6,
    }
    assert all(gate_verdict(good).values())
    assert gate_verdict({**good, "greedy_search": 0.5})["greedy_search"] is False  # greedy would already search
    assert gate_verdict({**good, "p_search": 0.05})["p_search"] is False  # too few mixed groups for GRPO
    assert gate_verdict({**good, "colour_greedy_search": 0.1})["colour_greedy_search"] is False  # no search_free lesson


def test_a_reading_example_carries_loss_on_its_answer_turn_only():
    from types import SimpleNamespace

    from rlinf_ext.assets.mmsearch.sft import final_turn_only

    # search turn (3 model tokens), observation (2 inserted), answer turn (2 model tokens)
    t = SimpleNamespace(
        prompt_ids=[1, 2], response_ids=[10, 11, 12, 20, 21, 30, 31], response_mask=[1, 1, 1, 0, 0, 1, 1], images=()
    )
    assert final_turn_only(t).weights == [0, 0, 0, 0, 0, 1, 1]
    one_turn = SimpleNamespace(prompt_ids=[1], response_ids=[5, 6], response_mask=[1, 1], images=())
    assert final_turn_only(one_turn).weights == [0, 0]  # no observation: nothing after the search to learn
