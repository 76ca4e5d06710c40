"""The registry world's tokenizer, curriculum examples and probes, against the real agent loop's ids."""

from __future__ import annotations

import random

import pytest

from rlinf_ext.assets.core.search import CorpusTextSearch, LexicalRetriever
from rlinf_ext.assets.core.tokenizer import word_ids
from rlinf_ext.assets.registry import probes, reading
from rlinf_ext.assets.registry.generate import _tokenizer
from rlinf_ext.assets.registry.turns import RIGHT, Demonstration
from rlinf_ext.assets.registry.world import HELDOUT, TRAIN, Fact, Page, Question, build_registry_world
from rlinf_ext.assets.searchr1.sft import play_back


@pytest.fixture(scope="module")
def world():
    return build_registry_world(0)


@pytest.fixture(scope="module")
def tok(world):
    return _tokenizer(world)


def test_every_name_is_one_token_and_texts_round_trip(world, tok):
    ids = word_ids(tok, world.all_names)
    assert len(set(ids.values())) == len(world.all_names) == 1696
    q = world.questions(HELDOUT)[0]
    text = f"{q.question} {world.page_of(q.fact).contents}"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert ids[q.subject] in tok.encode(q.question, add_special_tokens=False)


def test_induction_example_repeats_a_run_and_never_pairs_a_forbidden_bigram(tok):
    rng = random.Random(0)
    pool = list(range(100, 160))
    forbidden = {(a, b) for a in pool for b in pool if (7 * a + b) % 17 == 0}  # one pair in 17
    for _ in range(50):
        e = reading.induction_example(rng, pool, forbidden)
        n = len(e.response_ids) + 1
        run = e.prompt_ids[:n]
        assert e.prompt_ids[-1] == run[0] and e.response_ids == run[1:] and e.weights == [1.0] * (n - 1)
        assert reading.INDUCTION_RUN[0] <= n <= reading.INDUCTION_RUN[1] and len(set(run)) == n
        assert not any(pair in forbidden for pair in zip(run, run[1:]))


def test_reading_example_is_the_loops_trajectory_of_the_same_turns(world, tok):
    """The short-layout example's response ids are what the Search-R1 loop builds for its turns and page."""
    ex = reading.reading_example(random.Random(1), tok, world.all_names, set(), copy_weight=5.0)
    q = Question(ex.fact.relation, ex.fact.subject, ex.fact.answer, TRAIN)
    [trajectory] = play_back(
        tok, [q], [Demonstration(q, RIGHT, ex.fact).turns()], CorpusTextSearch(LexicalRetriever([ex.page.contents]), 1)
    )
    assert ex.example.response_ids == trajectory.response_ids
    # loss: 0 on the observation, the copy weight on the restated answer only
    weighted = [(t, w) for t, w in zip(ex.example.response_ids, ex.example.weights) if w == 5.0]
    assert [tok.decode([t]) for t, _ in weighted] == [f" {ex.fact.answer}"]
    assert [w for w, m in zip(ex.example.weights, trajectory.response_mask) if not m] == [0.0] * (
        len(trajectory.response_mask) - sum(trajectory.response_mask)
    )
    assert (
        ex.context_ids
        == ex.example.prompt_ids + ex.example.response_ids[: len(ex.context_ids) - len(ex.example.prompt_ids)]
    )
    assert ex.fact in ex.page.facts and ex.candidates == tuple(f.answer for f in ex.page.facts)


def test_reading_example_skips_forbidden_pairs(world, tok):
    rng = random.Random(2)
    names = world.all_names[:8]
    forbidden = {(a, b) for a in names for b in names if a < b}  # half of the pairings
    for _ in range(20):
        ex = reading.reading_example(rng, tok, names, forbidden, 1.0)
        assert not any((f.subject, f.answer) in forbidden for f in ex.page.facts)


def test_search_context_is_the_loops_prefix(world, tok):
    q = world.questions(HELDOUT)[5]
    page = world.page_of(q.fact)
    [trajectory] = play_back(
        tok, [q], [Demonstration(q, RIGHT, q.fact).turns()], CorpusTextSearch(LexicalRetriever([page.contents]), 1)
    )
    context = probes.search_context(tok, q, page)
    assert context == trajectory.prompt_ids + trajectory.response_ids[: len(context) - len(trajectory.prompt_ids)]


def test_classify_answer():
    page = Page("capital", 1, (Fact("capital", "Aa", "Xx"), Fact("capital", "Bb", "Yy"), Fact("capital", "Cc", "Zz")))
    q = Question("capital", "Bb", "Yy", HELDOUT)
    assert probes.classify_answer("Yy", q, page) == probes.RIGHT
    assert probes.classify_answer(" zz ", q, page) == probes.OTHER_CANDIDATE  # normalised as EM is
    assert probes.classify_answer("unknown", q, page) == probes.GAVE_UP
    assert probes.classify_answer("Ww", q, page) == probes.OTHER
    assert probes.classify_answer(None, q, page) == probes.OTHER


def test_sampled_figures_hand_computed():
    q = Question("capital", "Bb", "Yy", HELDOUT)
    R, C, OT, G = probes.RIGHT, probes.OTHER_CANDIDATE, probes.OTHER, probes.GAVE_UP
    rows = [[probes.LiveOutcome(q, k, k != G) for k in kinds] for kinds in ([R, C, G, G], [C, OT, G, G])]
    f = probes.sampled_figures(rows)
    assert f["pass@1"] == 1 / 8 and f["pass@4"] == 1 / 2
    assert (f["share_right"], f["share_other_candidate"], f["share_other"], f["share_gave_up"]) == (
        1 / 8,
        2 / 8,
        1 / 8,
        4 / 8,
    )
    assert f["search_rate"] == 4 / 8
    assert f["wrong_that_are_candidates"] == 2 / 3  # give-ups are the other choice, not errors of reading
    assert f["right_vs_each_distractor"] == 1 / (2 / 2)


def test_edited_page_and_counterfactual_answers(world):
    q = world.questions(HELDOUT)[0]
    page = world.page_of(q.fact)
    [edit] = probes.counterfactual_answers(world, [q], seed=0)
    assert edit not in {f.answer for f in page.facts}
    assert edit in {f.answer for f in world.facts if f.relation == q.relation}
    edited = probes.edited_page(page, q.subject, edit)
    assert f"{q.subject} {edit}" in edited.text and q.fact.pair not in edited.text
    assert [f.subject for f in edited.facts] == [f.subject for f in page.facts]
