"""The MMSearch-R1 reward against a table of hand-computed cases (format_penalty 0.1, search_penalty 0.1): the
shared `reward` section and the agent's own terms (`agentloop.mmsearch.reward`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from rlinf_ext.agent.mmsearch.config import RewardShapingConfig
from rlinf_ext.agent.mmsearch.reward import (
    clean_turn,
    format_score,
    mmsearch_reward,
    mmsearch_score,
    penalty_at,
    search_counts,
)
from rlinf_ext.config.schema import RewardConfig
from rlinf_ext.protocol.agents import agent_spec

IMG = "<reason> I need to look this emblem up. </reason><search><img></search>"
TXT = "<reason> The emblem is Drelia's. </reason><text_search> Drelia founded </text_search>"
ANS = "<reason> The page says so. </reason><answer> {} </answer>"
GOLDS = ["Drelia", "City of Drelia"]


SHAPING = {f.name for f in dataclasses.fields(RewardShapingConfig)}  # agentloop.mmsearch.reward's keys


def cfg(**kw) -> RewardConfig:
    """The shared `reward` section of the table (format_penalty 0.1 is the agent's: `shaping`)."""
    base = dict(scoring="em", search_penalty=0.1)
    base.update({k: v for k, v in kw.items() if k not in SHAPING})
    return RewardConfig(**base)


def shaping(**kw) -> RewardShapingConfig:
    base = dict(format_penalty=0.1)
    base.update({k: v for k, v in kw.items() if k in SHAPING})
    return RewardShapingConfig(**base)


def score(turns, golds, step: int = 0, **kw):
    return mmsearch_score(turns, golds, cfg(**kw), step=step, shaping=shaping(**kw))


CASES = [
    # (id, turns, golds, cfg overrides, expected reward, expected format)
    ("direct-correct", [ANS.format("drelia")], GOLDS, {}, 1.0, 1.0),
    ("direct-wrong", [ANS.format("Kroun")], GOLDS, {}, 0.1, 1.0),
    ("direct-no-reason", ["<answer> Drelia </answer>"], GOLDS, {}, 0.9, 0.0),
    ("candidate-answer", [ANS.format("the city of drelia!")], GOLDS, {}, 1.0, 1.0),
    ("image-then-correct", [IMG, ANS.format("Drelia")], GOLDS, {}, 0.9 * 0.9 + 0.1, 1.0),
    ("text-then-wrong", [TXT, ANS.format("Kroun")], GOLDS, {}, 0.1, 1.0),
    ("image-text-correct-once", [IMG, TXT, ANS.format("Drelia")], GOLDS, {}, 0.9 * 0.9 + 0.1, 1.0),
    (
        "image-text-correct-per-search",
        [IMG, TXT, ANS.format("Drelia")],
        GOLDS,
        {"use_search_count_penalty": True},
        0.9 * 0.81 + 0.1,
        1.0,
    ),
    ("text-image-wrong-order", [TXT, IMG, ANS.format("Drelia")], GOLDS, {}, 0.9 * 0.9, 0.0),
    ("two-image-searches", [IMG, IMG, ANS.format("Drelia")], GOLDS, {}, 0.9 * 0.9, 0.0),
    ("im-end-stripped", [IMG + "<|im_end|>", ANS.format("Drelia") + "<|im_end|>\n"], GOLDS, {}, 0.91, 1.0),
    ("answer-not-in-last-turn", [ANS.format("Drelia"), IMG], GOLDS, {}, 0.0, 0.0),
    ("two-reasons", ["<reason> a </reason><reason> b </reason><answer> Drelia </answer>"], GOLDS, {}, 0.9, 0.0),
    (
        "two-answers-last-wins",
        ["<reason> a </reason><answer> Kroun </answer><answer> Drelia </answer>"],
        GOLDS,
        {},
        0.9,
        0.0,
    ),
    (
        "text-after-image-call",
        ["<reason> a </reason><search><img></search> and more", ANS.format("Drelia")],
        GOLDS,
        {},
        0.9 * 0.9,
        0.0,
    ),
    (
        "search-and-answer-in-one-turn",
        ["<reason> a </reason><search><img></search><answer> Drelia </answer>"],
        GOLDS,
        {},
        0.9 * 0.9,
        0.0,
    ),
    (
        "empty-text-search-query-still-format",
        ["<reason> a </reason><text_search></text_search>", ANS.format("Drelia")],
        GOLDS,
        {},
        0.91,
        1.0,
    ),
    ("four-turns", [IMG, TXT, TXT, ANS.format("Drelia")], GOLDS, {}, 0.9 * 0.9, 0.0),
    ("subem-scoring", [ANS.format("it is Drelia town")], ["Drelia"], {"scoring": "subem"}, 1.0, 1.0),
    ("em-scoring-rejects-substring", [ANS.format("it is Drelia town")], ["Drelia"], {}, 0.1, 1.0),
    ("no-format-penalty", [IMG, ANS.format("Drelia")], GOLDS, {"format_penalty": 0.0}, 0.9, 1.0),
    ("reward-scale", [ANS.format("Drelia")], GOLDS, {"reward_scale": 2.0}, 2.0, 1.0),
    (
        "warmup-start-rewards-search",
        [IMG, ANS.format("Drelia")],
        GOLDS,
        {"search_penalty_warmup_steps": 10},
        0.9 * 1.1 + 0.1,
        1.0,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reward_table(case):
    _, turns, golds, overrides, expected, expected_format = case
    result = score(turns, golds, step=0, **overrides)
    assert result.score == pytest.approx(expected, abs=1e-12)
    assert result.format_score == expected_format


def test_warmup_ramp_midway_and_after():
    assert penalty_at(0, 0.1, 10) == pytest.approx(-0.1)
    assert penalty_at(5, 0.1, 10) == pytest.approx(0.0)
    assert penalty_at(10, 0.1, 10) == pytest.approx(0.1)
    assert penalty_at(3, 0.1, 0) == pytest.approx(0.1)
    r = score([IMG, ANS.format("Drelia")], GOLDS, step=5, search_penalty_warmup_steps=10)
    assert r.score == pytest.approx(0.9 * 1.0 + 0.1) and r.penalty == pytest.approx(0.0)


def test_counts_answer_and_cleaning():
    assert search_counts([IMG, TXT, ANS.format("x")]) == (1, 1)
    assert search_counts(["<text_search> unclosed"]) == (0, 0)
    assert clean_turn("  <answer> a </answer><|im_end|> \n<|endoftext|>") == "<answer> a </answer>"
    r = score([IMG, ANS.format(" Drelia ")], GOLDS)
    assert (r.answer, r.correct, r.em, r.image_searches, r.text_searches) == ("Drelia", True, 1.0, 1, 0)
    assert format_score([]) == 0.0


def test_the_agents_reward_and_clear_errors():
    fn = agent_spec("mmsearch").load("reward")
    assert fn is mmsearch_reward
    assert fn("ignored", GOLDS, cfg(), turns=[ANS.format("Drelia")]).score == pytest.approx(1.0)
    # its own terms come from the agent's section: format_penalty 0.1 there, a direct answer without a reason
    section = SimpleNamespace(reward=shaping())
    assert fn("x", GOLDS, cfg(), turns=["<answer> Drelia </answer>"]).score == pytest.approx(1.0)
    assert fn("x", GOLDS, cfg(), turns=["<answer> Drelia </answer>"], agent_cfg=section).score == pytest.approx(0.9)
    with pytest.raises(ValueError, match="turns="):
        fn("<reason> a </reason><answer> Drelia </answer>", GOLDS, cfg())
    with pytest.raises(ValueError, match="em or subem|one of"):
        mmsearch_score([ANS.format("x")], GOLDS, cfg(scoring="f1"))
