"""The MMSearch-R1 loop on scripted turns over the real tiny VL tokenizer/processor and the tiny image cache."""

from __future__ import annotations

import asyncio
import pickle
from dataclasses import replace

import pytest

from rlinf_ext.agent.mmsearch.config import MMSearchConfig, RewardShapingConfig
from rlinf_ext.agent.mmsearch.loop import check_invariants, first_prompt_ids, run_group, run_trajectory
from rlinf_ext.agent.mmsearch.metrics import reward_fn
from rlinf_ext.agent.mmsearch.observation import build_observation
from rlinf_ext.agent.mmsearch.prompts import Prompts, read_prompt
from rlinf_ext.agent.mmsearch.protocol import parse_action
from rlinf_ext.agent.mmsearch.types import Task
from rlinf_ext.config.schema import RewardConfig
from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.generation.hf_vl import load_vl_processor
from rlinf_ext.protocol.vl_tokens import IMAGE_PAD
from tests.support.mm_helpers import PX, ScriptedVLGenerator, settings, tools

IMG = "<reason> I look the emblem up. </reason><search><img></search>"
TXT = "<reason> It is {city}. </reason><text_search> {city} founded year </text_search>"
ANS = "<reason> Done. </reason><answer> {a} </answer><|im_end|>"


@pytest.fixture(scope="module")
def world(tiny_mm_assets):
    mm = tiny_mm_assets.mm
    processor = load_vl_processor(mm.processor_dir)
    rows = read_fvqa(mm.fvqa_test, PX, PX)
    return mm, processor, {r.data_source: Task.from_row(r) for r in rows}


def _run(processor, task, script, cache_dir, **kw):
    gen = ScriptedVLGenerator(script, tokenizer=processor.tokenizer)
    traj = asyncio.run(run_trajectory(gen, processor, tools(cache_dir), task, settings(**kw.pop("s", {})), **kw))
    return gen, traj


@pytest.mark.parametrize("n_image_obs", [0, 1, 2])
def test_invariants_with_0_1_2_image_observations(world, n_image_obs):
    mm, processor, tasks = world
    task = tasks["tinymm_city"]
    script = {
        0: [ANS.format(a="x")],
        1: [IMG, TXT.format(city="Drelia"), ANS.format(a="x")],
        2: [IMG, IMG, ANS.format(a="x")],
    }[n_image_obs]
    gen, traj = _run(processor, task, script, mm.cache_test, s={"image_search_limit": 2})
    check_invariants(traj, processor)  # also checked inside the loop
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert len(traj.images) == 1 + 3 * n_image_obs and traj.images[0] == task.images[0]
    obs_pads = [t for t, m in zip(traj.response_ids, traj.response_mask) if t == pad]
    assert len(obs_pads) == 4 * 3 * n_image_obs and all(
        m == 0 for t, m in zip(traj.response_ids, traj.response_mask) if t == pad
    )
    assert sum(traj.response_mask) == sum(len(t.response_ids) for t in traj.turns)
    # every call saw the whole context and every image so far, in order
    for k, (call, images) in enumerate(zip(gen.calls, gen.images_seen)):
        assert call.prompt_ids == traj.turns[k].prompt_ids
        assert images == traj.images[: len(images)] and call.prompt_ids.count(pad) == 4 * len(images)
    assert traj.end_reason == "answer" and traj.metrics["image_searches"] == n_image_obs


def test_observation_ids_equal_a_processor_re_encode(world):
    mm, processor, tasks = world
    task = tasks["tinymm_city"]
    found = asyncio.run(tools(mm.cache_test).image_search.run(task.data_id))
    prompts = Prompts()
    body, images = prompts.image_results_header + found.body, found.images
    obs = build_observation(processor, prompts, body, images, task.question, prompts.after_image_search, False)
    reference = (
        processor(text=[obs.text], images=[r.to_pil() for r in images], return_tensors="pt").input_ids[0].tolist()
    )
    assert obs.ids == reference and obs.image_tokens == 12
    # incremental context == a full re-encode of prompt + sampled + observation
    prompt_ids = first_prompt_ids(processor, prompts, task)
    sampled = processor.tokenizer.encode(IMG, add_special_tokens=False)
    full_text = (
        processor.tokenizer.decode(prompt_ids + sampled).replace("<|image_pad|>" * 4, "<|image_pad|>") + obs.text
    )
    full = processor(text=[full_text], images=[r.to_pil() for r in [*task.images, *images]], return_tensors="pt")
    assert prompt_ids + sampled + obs.ids == full.input_ids[0].tolist()


def test_question_comes_from_the_row_and_prompts_are_replaceable(world, tmp_path):
    mm, processor, tasks = world
    task = replace(tasks["tinymm_city"], question="Which city? (row text)")
    gen, traj = _run(processor, task, [IMG, ANS.format(a="y")], mm.cache_test)
    second_context = processor.tokenizer.decode(gen.calls[1].prompt_ids)
    assert "Question: Which city? (row text)" in second_context and Prompts().after_image_search in second_context
    (tmp_path / "after.txt").write_text("CUSTOM AFTER IMAGE")
    (tmp_path / "round1.pkl").write_bytes(pickle.dumps("CUSTOM ROUND ONE"))
    section = MMSearchConfig().prompts
    section.after_image_search, section.round_1 = str(tmp_path / "after.txt"), str(tmp_path / "round1.pkl")
    section.observation = "Found: <information>{results}</information>\n{instruction} Q: {question}"
    prompts = Prompts.from_config(section)
    gen, _ = _run(processor, task, [IMG, ANS.format(a="y")], mm.cache_test, prompts=prompts)
    first, second = (processor.tokenizer.decode(c.prompt_ids) for c in gen.calls)
    assert "CUSTOM ROUND ONE" in first and "CUSTOM AFTER IMAGE Q: Which city? (row text)" in second
    assert read_prompt("plain text prompt", "k") == "plain text prompt"
    (tmp_path / "bad.pkl").write_bytes(pickle.dumps(eval))
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        read_prompt(str(tmp_path / "bad.pkl"), "k")


def test_limits_last_round_and_budget(world):
    mm, processor, tasks = world
    task = tasks["tinymm_city"]
    _, twice = _run(processor, task, [IMG, IMG], mm.cache_test)
    assert [t.action for t in twice.turns] == ["image_search", "search_limit"] and twice.end_reason == "search_limit"
    assert twice.metrics["image_searches"] == 1 and twice.metrics["search_limit_hits"] == 1
    _, last = _run(
        processor, task, [IMG, TXT.format(city="A"), TXT.format(city="B")], mm.cache_test, s={"text_search_limit": 5}
    )
    assert last.turns[-1].action == "search_limit" and last.metrics["text_searches"] == 1
    _, short = _run(processor, task, [IMG, ANS.format(a="z")], mm.cache_test, s={"response_length_total": 40})
    assert short.end_reason == "response_budget" and len(short.response_ids) <= 40
    assert short.turns[0].observation_ids == [] and short.images == list(task.images)


def test_text_search_observation_is_cut_by_tokens(world):
    mm, processor, tasks = world
    task = tasks["tinymm_city"]
    _, full = _run(processor, task, [TXT.format(city="Drelia"), ANS.format(a="z")], mm.cache_test)
    _, cut = _run(
        processor, task, [TXT.format(city="Drelia"), ANS.format(a="z")], mm.cache_test, s={"max_obs_length": 5}
    )
    assert cut.metrics["truncated_observations"] == 1 and full.metrics["truncated_observations"] == 0
    assert len(cut.turns[0].observation_ids) < len(full.turns[0].observation_ids)
    assert cut.turns[0].query == "Drelia founded year" and cut.turns[0].tool == "text"


def test_each_trajectory_searches_its_own_data_id(world):
    mm, processor, tasks = world

    def script(k, context):
        return IMG if context.count("<|im_start|>assistant") == 1 else ANS.format(a="w")

    async def many():
        gen = ScriptedVLGenerator(script, tokenizer=processor.tokenizer)
        t = tools(mm.cache_test)
        return await asyncio.gather(*(run_group(gen, processor, t, task, settings(), 2) for task in tasks.values()))

    for task, group in zip(tasks.values(), asyncio.run(many())):
        expected = asyncio.run(tools(mm.cache_test).image_search.run(task.data_id))
        for traj in group:
            assert traj.data_id == task.data_id and traj.turns[0].titles == [h.title for h in expected.hits]
            assert [i.sha1 for i in traj.images[1:]] == [h.image.sha1 for h in expected.hits]


def test_banned_ids_from_an_engine_are_dropped_and_invariants_catch_breakage(world):
    mm, processor, tasks = world
    task = tasks["tinymm_colour"]
    _, traj = _run(processor, task, ["<reason> hm <|image_pad|> </reason><answer> red </answer>"], mm.cache_test)
    assert traj.turns[0].banned_dropped == 1 and traj.turns[0].action == "invalid"
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert pad not in traj.response_ids
    _, good = _run(processor, task, [IMG, ANS.format(a="red")], mm.cache_test)
    k = good.response_ids.index(pad)
    flipped = replace(good, response_mask=good.response_mask[:k] + [1] + good.response_mask[k + 1 :])
    with pytest.raises(AssertionError, match="loss-mask invariant"):
        check_invariants(flipped, processor)
    with pytest.raises(AssertionError, match="image-pad invariant"):
        check_invariants(replace(good, images=good.images[:-1]), processor)


def test_token_versions_follow_the_turns_through_an_image_observation_and_a_dropped_id(world):
    """Version plumbing of the MM loop: each turn's weight version on its kept ids (also after banned ids were
    dropped), -1 on the observation (image pads included), in step with the kept log-probs."""
    mm, processor, tasks = world
    task = tasks["tinymm_colour"]
    script = [IMG, "<reason> hm <|image_pad|> </reason><answer> red </answer>"]
    gen = ScriptedVLGenerator(script, tokenizer=processor.tokenizer)
    versions = iter([4, 5])

    async def versioned(prompt_ids, sampling_params, images=None):
        return replace(
            await ScriptedVLGenerator.generate(gen, prompt_ids, sampling_params, images), weight_version=next(versions)
        )

    gen.generate = versioned
    traj = asyncio.run(run_trajectory(gen, processor, tools(mm.cache_test), task, settings()))
    first, second = traj.turns
    assert second.banned_dropped == 1 and (first.weight_version, second.weight_version) == (4, 5)
    assert traj.rollout_versions == (
        [4] * len(first.response_ids) + [-1] * len(first.observation_ids) + [5] * len(second.response_ids)
    )
    assert len(traj.rollout_logprobs) == len(traj.rollout_versions) == len(traj.response_ids)


def test_a_turn_sampled_by_two_versions_keeps_them_per_token_after_a_dropped_id(world):
    """A turn vLLM resumed on new weights after a preemption (issue 42): one version per id, and the ids dropped as
    banned take their versions with them."""
    mm, processor, tasks = world
    task = tasks["tinymm_colour"]
    gen = ScriptedVLGenerator(
        ["<reason> hm <|image_pad|> </reason><answer> red </answer>"], tokenizer=processor.tokenizer
    )
    sampled = {}

    async def preempted(prompt_ids, sampling_params, images=None):
        result = await ScriptedVLGenerator.generate(gen, prompt_ids, sampling_params, images)
        sampled["ids"] = list(result.output_ids)
        return replace(result, weight_version=[4] * 3 + [5] * (len(result.output_ids) - 3))

    gen.generate = preempted
    traj = asyncio.run(run_trajectory(gen, processor, tools(mm.cache_test), task, settings()))
    (turn,) = traj.turns
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    k = sampled["ids"].index(pad)
    assert turn.banned_dropped == 1 and k >= 3  # the dropped id is one of version 5's
    assert turn.weight_version == traj.rollout_versions == [4] * 3 + [5] * (len(sampled["ids"]) - 4)
    assert len(traj.rollout_logprobs) == len(traj.rollout_versions) == len(traj.response_ids)


def test_dropping_banned_ids_drops_their_per_token_versions():
    """``_drop_banned`` alone (no tiny assets): ids 9 (banned) and 70 (past the vocabulary) go, and with them their
    log-probs and their versions when the turn has one per id; one version for the call stays as it is."""
    from rlinf_ext.agent.mmsearch.loop import _drop_banned
    from rlinf_ext.protocol.generation import GenerationResult

    class Vocab64:
        def __len__(self):
            return 64

        def decode(self, ids):
            return " ".join(map(str, ids))

    result = GenerationResult(
        [1, 9, 2, 70, 3], "", "stop", None, [-0.1, -0.2, -0.3, -0.4, -0.5], weight_version=[4, 4, 5, 5, 5]
    )
    kept, dropped = _drop_banned(result, Vocab64(), {9})
    assert dropped == 2 and kept.output_ids == [1, 2, 3] and kept.text == "1 2 3"
    assert kept.weight_version == [4, 5, 5] and kept.logprobs == [-0.1, -0.3, -0.5]
    assert _drop_banned(replace(result, weight_version=6), Vocab64(), {9})[0].weight_version == 6


def test_actions_and_reward_on_a_scripted_three_turn_trajectory(world):
    mm, processor, tasks = world
    task = tasks["tinymm_city"]
    gold = task.answers[0]
    reward = reward_fn(RewardConfig(search_penalty=0.1), shaping=RewardShapingConfig(format_penalty=0.1))
    gen = ScriptedVLGenerator([IMG, TXT.format(city="X"), ANS.format(a=gold)], tokenizer=processor.tokenizer)
    traj = asyncio.run(run_trajectory(gen, processor, tools(mm.cache_test), task, settings(), reward_fn=reward))
    assert [t.action for t in traj.turns] == ["image_search", "text_search", "answer"]
    assert traj.reward == pytest.approx(0.91) and traj.reward_details.correct
    assert parse_action("<reason> a </reason><search><img></search> then", "length") == ("invalid", None)
    assert parse_action("x <text_search> a </text_search> <text_search> b </text_search><|im_end|>", "eos") == (
        "text_search",
        "b",
    )
    assert parse_action("<text_search>  </text_search>", "stop") == ("invalid", None)
    assert parse_action("no tags", "eos") == ("eos", None)
