"""Retokenisation drift (``agent/mmsearch/retokenize.py``): the counting by hand, then real trajectories of the MM
loop over the tiny VL processor: a canonical one is not counted, deliberately broken ones are (ids sampled as
pieces BPE would merge; an image pad run one short), and the rates reach the step's agent metrics."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from rlinf_ext.agent.mmsearch.loop import run_trajectory
from rlinf_ext.agent.mmsearch.retokenize import (
    IMAGE_PAD_MISMATCH,
    RETOKENIZE_MISMATCH,
    actor_ids,
    collapse_pad_runs,
    count_mismatches,
    mark_retokenize_mismatches,
    pad_runs,
)
from rlinf_ext.agent.mmsearch.rollout import agent_metrics
from rlinf_ext.agent.mmsearch.types import Task
from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.generation.hf_vl import load_vl_processor
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.generation import GenerationResult
from rlinf_ext.protocol.vl_tokens import IMAGE_PAD
from tests.support.mm_helpers import PX, ScriptedVLGenerator, settings, tools

P = 9  # the pad id of the hand-made rows


def test_pad_runs_and_collapse_by_hand():
    ids = [1, P, P, P, 2, P, 3, P, P]
    assert pad_runs(ids, P) == [3, 1, 2]
    assert collapse_pad_runs(ids, P) == [1, P, 2, P, 3, P]
    assert pad_runs([1, 2], P) == [] and collapse_pad_runs([P, P], P) == [P]


def test_count_mismatches_by_hand():
    pairs = [
        ([1, P, P, 2], [1, P, P, 2]),  # equal
        ([1, P, P, 2, 3], [1, P, P, 4]),  # ids differ, pad runs equal
        ([1, P, 2], [1, P, P, 2]),  # a run one short: both differ
        ([1, P, P, 2], None),  # the processor refused the conversation: both
    ]
    assert count_mismatches(pairs, P) == (3, 2)
    assert count_mismatches(pairs[:1], P) == (0, 0)


def test_metric_names_are_the_agent_metrics():
    assert mk.agent_metric(RETOKENIZE_MISMATCH) == mk.AGENT_RETOKENIZE_MISMATCH == "agent/retokenize_mismatch"
    assert mk.agent_metric(IMAGE_PAD_MISMATCH) == mk.AGENT_IMAGE_PAD_MISMATCH


IMG = "<reason> I look the emblem up. </reason><search><img></search>"
ANS = "<reason> Done. </reason><answer> x </answer><|im_end|>"


@pytest.fixture(scope="module")
def world(tiny_mm_assets):
    mm = tiny_mm_assets.mm
    processor = load_vl_processor(mm.processor_dir)
    task = next(Task.from_row(r) for r in read_fvqa(mm.fvqa_test, PX, PX) if r.data_source == "tinymm_city")
    return mm, processor, task


class _SplitAnswerGenerator(ScriptedVLGenerator):
    """Scripted turns; the answer turn's ids are its text encoded character by character (the same text as ids
    that BPE would merge: what a sampler can produce)."""

    def emulate_engine(self, text, params):
        result = super().emulate_engine(text, params)
        if "<answer>" not in result.text:
            return result
        ids = [i for ch in result.text for i in self.tokenizer.encode(ch, add_special_tokens=False)]
        return GenerationResult(ids, self.tokenizer.decode(ids), result.finish_reason, result.matched_stop)


def _trajectory(world, script, generator=ScriptedVLGenerator):
    mm, processor, task = world
    gen = generator(script, tokenizer=processor.tokenizer)
    return asyncio.run(run_trajectory(gen, processor, tools(mm.cache_test), task, settings()))


@pytest.mark.timeout(300)
def test_real_trajectories_canonical_and_deliberately_broken(world):
    mm, processor, task = world
    tok = processor.tokenizer
    canonical = _trajectory(world, [IMG, ANS])  # an image search (3 thumbnails) then an answer
    assert len(canonical.images) == 4
    loop_ids = canonical.prompt_ids + canonical.response_ids
    assert actor_ids(processor, loop_ids, canonical.images) == loop_ids

    # the same answer sampled as single characters: decodes to the same text, the processor merges it again
    split = _trajectory(world, [IMG, ANS], _SplitAnswerGenerator)
    assert tok.decode(split.response_ids) == tok.decode(canonical.response_ids)
    assert split.response_ids != canonical.response_ids

    # a thumbnail's pad run one short (what an observation built for another image size would hold)
    pad = tok.convert_tokens_to_ids(IMAGE_PAD)
    cut = canonical.response_ids.index(pad)
    short = dataclasses.replace(
        canonical,
        response_ids=canonical.response_ids[:cut] + canonical.response_ids[cut + 1 :],
        response_mask=canonical.response_mask[:cut] + canonical.response_mask[cut + 1 :],
        metrics=dict(canonical.metrics),
    )

    group = [canonical, split, short]
    mark_retokenize_mismatches(processor, group)
    assert [t.metrics[RETOKENIZE_MISMATCH] for t in group] == [0.0, 1.0, 1.0]
    assert [t.metrics[IMAGE_PAD_MISMATCH] for t in group] == [0.0, 0.0, 1.0]
    step = agent_metrics(group)
    assert step[mk.AGENT_RETOKENIZE_MISMATCH] == pytest.approx(2 / 3)
    assert step[mk.AGENT_IMAGE_PAD_MISMATCH] == pytest.approx(1 / 3)
