"""The registry world: the tiny text world in which reading the search result is the only way to score.

Every entity name is one token of the world's tokenizer (`assets/registry/tokenizer.py`). Every relation is a
one-to-one map from the subjects of one type to answers of another, so no answer is shared within a relation. The
corpus is registry pages: one page per relation and three subjects, `Capital registry 12` / `Traril Trestias;
Brute Fiagrouk; Velmo Nugret.`, the pairs in a seeded order. The search `capital of Traril` ranks that page first
(its two terms), so the observation holds the gold pair and two pairs of the same relation whose answers have the
gold answer's type; within a page the answer directly follows its subject, the copy one induction head makes.

The split is by entity: per subject type, 50 subjects are asked about in training (warm start and RL), 20 are held
out (their pages are in the corpus; no warm-start target and no RL prompt names their facts) and 17 only appear
on pages. So the held-out questions cannot be answered from memory: only by reading.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property

from rlinf_ext.assets.core.world import NameMaker

TRAIN, HELDOUT, PAGE_ONLY = "train", "heldout", "page_only"
SUBJECTS_PER_SPLIT = {TRAIN: 50, HELDOUT: 20, PAGE_ONLY: 17}  # per subject type; 87 = 29 pages of 3
PAIRS_PER_PAGE = 3
ENTITY_TYPES = ("country", "city", "person", "work", "river", "language", "currency", "sea")


@dataclass(frozen=True)
class Relation:
    name: str
    subject_type: str
    answer_type: str
    question: str  # with {s}
    query: str  # what the warm start searches for, with {s}
    title: str  # the registry pages' title word

    def question_of(self, subject: str) -> str:
        return self.question.format(s=subject)

    def query_of(self, subject: str) -> str:
        return self.query.format(s=subject)


# No years and no multi-word answers: every answer is one name, one token.
RELATIONS: tuple[Relation, ...] = (
    Relation("capital", "country", "city", "What is the capital of {s}?", "capital of {s}", "Capital"),
    Relation(
        "language",
        "country",
        "language",
        "What is the official language of {s}?",
        "official language of {s}",
        "Language",
    ),
    Relation("currency", "country", "currency", "What is the currency of {s}?", "currency of {s}", "Currency"),
    Relation("founder", "city", "person", "Who founded the city of {s}?", "founder of {s}", "Founder"),
    Relation("river", "city", "river", "Which river flows through {s}?", "river through {s}", "River"),
    Relation("birthplace", "person", "city", "Where was {s} born?", "birthplace of {s}", "Birthplace"),
    Relation("author", "work", "person", "Who wrote {s}?", "author of {s}", "Author"),
    Relation("sea", "river", "sea", "Into which sea does {s} flow?", "sea of {s}", "Sea"),
)


@dataclass(frozen=True)
class Fact:
    relation: str
    subject: str
    answer: str

    @property
    def pair(self) -> str:
        """The registry text that states the fact: the answer right after its subject."""
        return f"{self.subject} {self.answer}"


@dataclass(frozen=True)
class Page:
    relation: str
    number: int
    facts: tuple[Fact, ...]  # in page order

    @property
    def title(self) -> str:
        return f"{relation_by_name(self.relation).title} registry {self.number}"

    @property
    def text(self) -> str:
        return "; ".join(f.pair for f in self.facts) + "."

    @property
    def contents(self) -> str:
        """Search-R1's corpus `contents`: the quoted title on the first line."""
        return f'"{self.title}"\n{self.text}'


@dataclass(frozen=True)
class Question:
    relation: str
    subject: str
    answer: str
    split: str

    @property
    def question(self) -> str:
        return relation_by_name(self.relation).question_of(self.subject)

    @property
    def answers(self) -> tuple[str, ...]:
        return (self.answer,)

    @property
    def query(self) -> str:
        return relation_by_name(self.relation).query_of(self.subject)

    @property
    def fact(self) -> Fact:
        return Fact(self.relation, self.subject, self.answer)


@dataclass(frozen=True)
class RegistryWorld:
    names: dict[str, tuple[str, ...]]  # entity type -> names
    split_of: dict[str, str]  # subject name -> TRAIN | HELDOUT | PAGE_ONLY (subject types only)
    facts: tuple[Fact, ...]
    pages: tuple[Page, ...]
    reading_names: tuple[str, ...]  # extra single-token names for the reading phase (no entity of the world)

    def questions(self, split: str) -> list[Question]:
        return [
            Question(f.relation, f.subject, f.answer, split) for f in self.facts if self.split_of[f.subject] == split
        ]

    def page_of(self, fact: Fact) -> Page:
        return self._page_index[(fact.relation, fact.subject)]

    @property
    def all_names(self) -> list[str]:
        return [n for t in ENTITY_TYPES for n in self.names[t]] + list(self.reading_names)

    @cached_property
    def _page_index(self) -> dict[tuple[str, str], Page]:
        return {(p.relation, f.subject): p for p in self.pages for f in p.facts}


def relation_by_name(name: str) -> Relation:
    for r in RELATIONS:
        if r.name == name:
            return r
    raise KeyError(f"no relation {name!r}; known: {[r.name for r in RELATIONS]}")


def subject_types() -> list[str]:
    return list(dict.fromkeys(r.subject_type for r in RELATIONS))


def build_registry_world(seed: int, n_reading_names: int = 1000) -> RegistryWorld:
    """The world of ``seed``: names, the entity split, one-to-one facts and the registry pages."""
    rng = random.Random(seed + 101)
    maker = NameMaker(rng)
    per_type = sum(SUBJECTS_PER_SPLIT.values())
    names = {t: tuple(maker.word(2, 3) for _ in range(per_type)) for t in ENTITY_TYPES}
    reading = tuple(maker.word(2, 3) for _ in range(n_reading_names))
    split_of: dict[str, str] = {}
    for t in subject_types():
        order = list(names[t])
        rng.shuffle(order)
        start = 0
        for split, n in SUBJECTS_PER_SPLIT.items():
            split_of.update({s: split for s in order[start : start + n]})
            start += n
    facts: list[Fact] = []
    pages: list[Page] = []
    for relation in RELATIONS:
        subjects = list(names[relation.subject_type])
        answers = list(names[relation.answer_type])
        rng.shuffle(answers)  # a one-to-one map: no two subjects share an answer
        rel_facts = [Fact(relation.name, s, a) for s, a in zip(subjects, answers)]
        facts += rel_facts
        grouped = list(rel_facts)
        rng.shuffle(grouped)
        numbers = rng.sample(range(1, 100), len(grouped) // PAIRS_PER_PAGE)
        for k, number in enumerate(numbers):
            pages.append(Page(relation.name, number, tuple(grouped[k * PAIRS_PER_PAGE : (k + 1) * PAIRS_PER_PAGE])))
    rng.shuffle(pages)
    return RegistryWorld(names, split_of, tuple(facts), tuple(pages), reading)
