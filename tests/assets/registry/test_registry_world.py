"""The registry world: one-to-one relations, pages of three pairs, an entity split, the demonstrator's exact mix,
and what the asset build checks (no held-out pair trained, BM25 finds the subject's page)."""

from __future__ import annotations

from collections import Counter

import pytest

from rlinf_ext.assets.core.search import LexicalRetriever
from rlinf_ext.assets.core.sft import SFTExample
from rlinf_ext.assets.registry import turns
from rlinf_ext.assets.registry.generate import ablated_pages, world_stats
from rlinf_ext.assets.registry.warm_start import gate_verdict, heldout_fact_overlap
from rlinf_ext.assets.registry.world import (
    HELDOUT,
    PAGE_ONLY,
    RELATIONS,
    SUBJECTS_PER_SPLIT,
    TRAIN,
    Fact,
    Page,
    Question,
    build_registry_world,
)


@pytest.fixture(scope="module")
def world():
    return build_registry_world(0)


def test_relations_are_one_to_one_and_pages_hold_three_pairs_of_one_relation(world):
    for r in RELATIONS:
        facts = [f for f in world.facts if f.relation == r.name]
        assert len({f.subject for f in facts}) == len(facts) == len({f.answer for f in facts})
    assert all(len(p.facts) == 3 and {f.relation for f in p.facts} == {p.relation} for p in world.pages)
    assert Counter((f.relation, f.subject) for p in world.pages for f in p.facts) == Counter(
        (f.relation, f.subject) for f in world.facts
    )  # every fact on exactly one page


def test_split_is_by_entity(world):
    counts = Counter(world.split_of.values())
    n_types = len({r.subject_type for r in RELATIONS})
    assert counts == {split: n * n_types for split, n in SUBJECTS_PER_SPLIT.items()}
    train, heldout = world.questions(TRAIN), world.questions(HELDOUT)
    assert (len(train), len(heldout)) == (400, 160)
    assert not {q.subject for q in train} & {q.subject for q in heldout}
    assert Counter(q.relation for q in heldout) == {r.name: 20 for r in RELATIONS}
    assert world_stats(world)["heldout_subjects_asked_in_train"] == 0


def test_page_text_puts_each_answer_right_after_its_subject():
    page = Page(
        "capital",
        12,
        (
            Fact("capital", "Traril", "Trestias"),
            Fact("capital", "Brute", "Fiagrouk"),
            Fact("capital", "Velmo", "Nugret"),
        ),
    )
    assert page.contents == '"Capital registry 12"\nTraril Trestias; Brute Fiagrouk; Velmo Nugret.'


def test_bm25_ranks_the_subjects_page_first_for_every_heldout_query(world):
    retriever = LexicalRetriever([p.contents for p in world.pages])
    questions = world.questions(HELDOUT)
    tops = retriever.search([q.query for q in questions], topk=1)
    assert all(top[0] == world.page_of(q.fact).contents for top, q in zip(tops, questions))


def test_ablated_corpus_never_states_an_asked_pair(world):
    pages = ablated_pages(world)
    kept = {(f.subject, f.answer) for p in pages for f in p.facts}
    assert kept and all(world.split_of[s] == PAGE_ONLY for s, _ in kept)
    assert all(p.facts for p in pages)


def test_demonstrations_give_every_question_the_same_exact_mix(world):
    questions = world.questions(TRAIN)[:30]
    no_heldout = lambda f: world.split_of[f.subject] != HELDOUT  # noqa: E731
    demos = turns.demonstrations(questions, world.page_of, 0.5, 2 / 3, seed=3, per_question=6, may_restate=no_heldout)
    assert turns.demonstration_counts(6, 0.5, 2 / 3) == (3, 2, 1)
    for q in questions:
        mine = [d for d in demos if d.question == q]
        kinds = Counter(d.kind for d in mine)
        wrong = [d for d in mine if d.kind == turns.OTHER_CANDIDATE]
        assert kinds[turns.GIVE_UP] == 3 and len(mine) == 6
        assert all(
            d.restated in world.page_of(q.fact).facts and d.restated.subject != q.subject and no_heldout(d.restated)
            for d in wrong
        )
        # a page whose other pairs are all held out gets a right demonstration instead
        assert kinds[turns.RIGHT] + kinds[turns.OTHER_CANDIDATE] == 3
    assert demos == turns.demonstrations(
        questions, world.page_of, 0.5, 2 / 3, seed=3, per_question=6, may_restate=no_heldout
    )  # seeded
    with pytest.raises(ValueError, match="give_up_share"):
        turns.demonstration_counts(6, 1.5, 0.5)


def test_demonstration_turns():
    fact = Fact("capital", "Traril", "Trestias")
    demo = turns.Demonstration(Question("capital", "Traril", "Trestias", TRAIN), turns.RIGHT, fact)
    search, answer = demo.turns()
    assert search.text == (
        "<think> I need to search for capital of Traril. </think>\n<search> capital of Traril </search>"
    )
    assert answer.text == "<think> Traril Trestias </think>\n<answer> Trestias </answer><|im_end|>"
    assert [answer.text[a:b] for a, b in answer.copied] == ["Trestias"]
    give_up = turns.Demonstration(demo.question, turns.GIVE_UP, None).turns()
    assert [s.text for s in give_up] == [turns.ABSTAIN_TEXT]


def test_heldout_fact_overlap_counts_a_pair_trained_as_subject_then_answer():
    forbidden = {(7, 9)}
    clean = SFTExample(prompt_ids=[1, 7], response_ids=[5, 9], weights=[1.0, 1.0])  # 9 after 5, not after 7
    context = SFTExample(prompt_ids=[7, 9], response_ids=[3], weights=[1.0])  # the pair only in the prompt
    leak = SFTExample(prompt_ids=[1, 7], response_ids=[9, 3], weights=[1.0, 1.0])  # 9 trained right after 7
    masked = SFTExample(prompt_ids=[1, 7], response_ids=[9, 3], weights=[0.0, 1.0])  # an observation: no loss
    assert heldout_fact_overlap([clean, context, masked], forbidden) == 0
    assert heldout_fact_overlap([clean, leak, leak], forbidden) == 1


def test_gate_verdict_reads_each_bound():
    good = {
        "greedy_em": 0.0,
        "pass@1": 0.3,
        "pass@8": 0.9,
        "wrong_that_are_candidates": 0.6,
        "right_vs_each_distractor": 2.5,
        "counterfactual_follow": 0.85,
        "no_observation_em": 0.0,
    }
    assert all(gate_verdict(good).values())
    assert gate_verdict({**good, "pass@1": 0.5})["pass@1"] is False  # too strong a start leaves RL nothing
    assert gate_verdict({**good, "no_observation_em": 0.06})["no_observation_em"] is False
    assert gate_verdict({**good, "greedy_em": 0.4})["greedy_em"] is False  # the start: at most 0.35
