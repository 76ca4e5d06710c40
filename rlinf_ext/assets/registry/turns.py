"""The agent's turns in the registry world, and the imperfect demonstrator the warm start imitates.

A searched trajectory is two turns: `<think> I need to search for capital of Traril. </think>\\n<search> capital
of Traril </search>`, the observation (the registry page), then `<think> Traril Trestias </think>\\n<answer>
Trestias </answer>`: the subject restated, the answer copied from right after it. Every train question is
demonstrated several times with the same mix: a give-up without searching (`ABSTAIN_TEXT`, answer "unknown") on
an exact share, and among the searched ones the question's own pair restated on an exact share, another pair of
the same page (another candidate answer of the right type) on the rest. GRPO then has two one-token decisions to sharpen: search or
give up (the word after `<think> I`), and which subject of the page to restate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlinf_ext.assets.registry.world import Fact, Page, Question
from rlinf_ext.assets.searchr1.trajectories import ABSTAIN_TEXT, Segment, format_observation

IM_END = "<|im_end|>"
RIGHT, OTHER_CANDIDATE, GIVE_UP = "right", "other_candidate", "give_up"  # a demonstration's kind


def search_turn(query: str) -> Segment:
    return Segment(f"<think> I need to search for {query}. </think>\n<search> {query} </search>", True)


def answer_turn(fact: Fact) -> Segment:
    """Restate ``fact``'s pair, then answer with its answer; the restated answer is the copied span."""
    head = f"<think> {fact.subject} "
    text = f"{head}{fact.answer} </think>\n<answer> {fact.answer} </answer>{IM_END}"
    return Segment(text, True, ((len(head), len(head) + len(fact.answer)),))


def give_up_turn() -> Segment:
    return Segment(ABSTAIN_TEXT, True)


def page_observation(page: Page) -> str:
    """The observation text the loop inserts when the search returns ``page`` alone (Search-R1's layout)."""
    return format_observation([page.contents])


@dataclass(frozen=True)
class Demonstration:
    question: Question
    kind: str  # RIGHT | OTHER_CANDIDATE | GIVE_UP
    restated: Fact | None  # the pair the final turn restates (None: gave up)

    def turns(self) -> list[Segment]:
        """The model's turns (the loop inserts the observation after the search turn)."""
        if self.restated is None:
            return [give_up_turn()]
        return [search_turn(self.question.query), answer_turn(self.restated)]


def demonstration_counts(per_question: int, give_up_share: float, right_share: float) -> tuple[int, int, int]:
    """(give-ups, right, other-candidate) demonstrations of one question: the shares rounded at each level."""
    for name, share in (("give_up_share", give_up_share), ("right_share", right_share)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must be a share in [0, 1], got {share}")
    give_up = round(per_question * give_up_share)
    right = round((per_question - give_up) * right_share)
    return give_up, right, per_question - give_up - right


def demonstrations(
    questions: list[Question],
    page_of,
    give_up_share: float,
    right_share: float,
    seed: int,
    per_question: int = 5,
    may_restate=lambda fact: True,
) -> list[Demonstration]:
    """``per_question`` demonstrations of every question, with the same mix for each (`demonstration_counts`): the
    model cannot tie a choice to a question, so its probabilities are the shares, the same on new subjects. A
    wrong demonstration restates another pair of the question's page that ``may_restate`` (a seeded choice; the
    caller excludes the held-out facts, so no held-out pair becomes a target); a page without one gets a right
    demonstration instead. ``page_of(fact)`` -> the page that states the fact."""
    rng = random.Random(seed)
    n_give_up, n_right, n_wrong = demonstration_counts(per_question, give_up_share, right_share)
    out = []
    for q in questions:
        alternatives = [f for f in page_of(q.fact).facts if f.subject != q.subject and may_restate(f)]
        out += [Demonstration(q, GIVE_UP, None)] * n_give_up + [Demonstration(q, RIGHT, q.fact)] * n_right
        out += [
            Demonstration(q, OTHER_CANDIDATE, rng.choice(alternatives))
            if alternatives
            else Demonstration(q, RIGHT, q.fact)
            for _ in range(n_wrong)
        ]
    return out
