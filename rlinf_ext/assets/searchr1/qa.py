"""Single-hop and two-hop questions about the invented world, split into train and seven test sets.

Each question keeps its reasoning chain (`hops`: the sub-question, the search query and the answer of each
hop) so that the warm-start trajectories can search for each hop in turn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlinf_ext.assets.core import facts as F
from rlinf_ext.assets.core.facts import Fact
from rlinf_ext.assets.core.world import World

BENCHMARKS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
SINGLE_HOP = ("nq", "triviaqa", "popqa")
MULTI_HOP = ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


@dataclass(frozen=True)
class Hop:
    query: str  # what a searcher would type for this hop
    fact: Fact  # the passage sentence this hop finds; `fact.answer` is the bridge (or final) answer

    @property
    def answer(self) -> str:
        return self.fact.answer


@dataclass(frozen=True)
class Question:
    question: str
    answers: tuple[str, ...]  # gold answers (first is canonical)
    hops: tuple[Hop, ...]

    @property
    def multi_hop(self) -> bool:
        return len(self.hops) > 1


def _country_answers(name: str) -> tuple[str, ...]:
    return (name, f"Republic of {name}")


def _river_answers(title: str) -> tuple[str, ...]:
    return (title, title.removesuffix(" River"))


class _Hops:
    """The hop (query + fact) for each relation of the world, so single- and two-hop questions agree."""

    def __init__(self, world: World):
        self.w = world

    def capital(self, country: str) -> Hop:
        return Hop(f"capital of {country}", F.capital(country, self.w.countries[country].capital))

    def language(self, country: str) -> Hop:
        return Hop(f"official language of {country}", F.language(country, self.w.countries[country].language))

    def currency(self, country: str) -> Hop:
        return Hop(f"currency of {country}", F.currency(country, self.w.countries[country].currency))

    def country_of(self, city: str) -> Hop:
        return Hop(f"{city} city country", F.city_country(city, self.w.cities[city].country))

    def river_of(self, city: str) -> Hop:
        return Hop(f"river through {city}", F.city_river(city, self.w.rivers[self.w.cities[city].river].title))

    def founder_of(self, city: str) -> Hop:
        return Hop(f"founder of {city}", F.city_founder(city, self.w.cities[city].founder))

    def founded_year(self, city: str) -> Hop:
        return Hop(f"{city} founded year", F.city_year(city, self.w.cities[city].founded))

    def birthplace(self, person: str) -> Hop:
        return Hop(f"{person} birthplace", F.birthplace(person, self.w.people[person].birthplace))

    def birth_year(self, person: str) -> Hop:
        return Hop(f"{person} born year", F.birth_year(person, self.w.people[person].born))

    def author(self, work: str) -> Hop:
        return Hop(f"author of {work}", F.author(work, self.w.works[work].author))

    def sea_of(self, river_title: str) -> Hop:
        name = river_title.removesuffix(" River")
        return Hop(f"{river_title} sea", F.river_sea(name, self.w.rivers[name].sea))


def single_hop_questions(world: World) -> list[Question]:
    h = _Hops(world)
    qs: list[Question] = []
    for c in world.countries:
        qs.append(Question(f"What is the capital of {c}?", (world.countries[c].capital,), (h.capital(c),)))
        qs.append(Question(f"What is the official language of {c}?", (world.countries[c].language,), (h.language(c),)))
        qs.append(Question(f"What is the currency of {c}?", (world.countries[c].currency,), (h.currency(c),)))
    for name, city in world.cities.items():
        if name in world.distractor_cities:
            continue
        qs.append(
            Question(f"In which country is the city of {name}?", _country_answers(city.country), (h.country_of(name),))
        )
        qs.append(
            Question(
                f"Which river flows through {name}?",
                _river_answers(world.rivers[city.river].title),
                (h.river_of(name),),
            )
        )
        qs.append(Question(f"Who founded the city of {name}?", (city.founder,), (h.founder_of(name),)))
        qs.append(Question(f"In what year was {name} founded?", (str(city.founded),), (h.founded_year(name),)))
    for name, p in world.people.items():
        if name in world.distractor_people:
            continue
        qs.append(Question(f"Where was {name} born?", (p.birthplace,), (h.birthplace(name),)))
        qs.append(Question(f"In what year was {name} born?", (str(p.born),), (h.birth_year(name),)))
    for title, w in world.works.items():
        qs.append(Question(f"Who wrote {title}?", (w.author,), (h.author(title),)))
    for r in world.rivers.values():
        qs.append(Question(f"Into which sea does the {r.title} flow?", (r.sea,), (h.sea_of(r.title),)))
    return qs


def two_hop_questions(world: World) -> list[Question]:
    h = _Hops(world)
    qs: list[Question] = []
    for c, country in world.countries.items():
        cap = world.cities[country.capital]
        qs.append(
            Question(
                f"Which river flows through the capital of {c}?",
                _river_answers(world.rivers[cap.river].title),
                (h.capital(c), h.river_of(cap.name)),
            )
        )
        qs.append(Question(f"Who founded the capital of {c}?", (cap.founder,), (h.capital(c), h.founder_of(cap.name))))
    for name, city in world.cities.items():
        qs.append(
            Question(
                f"In what year was the founder of {name} born?",
                (str(world.people[city.founder].born),),
                (h.founder_of(name), h.birth_year(city.founder)),
            )
        )
        river_title = world.rivers[city.river].title
        qs.append(
            Question(
                f"Into which sea does the river of {name} flow?",
                (world.rivers[city.river].sea,),
                (h.river_of(name), h.sea_of(river_title)),
            )
        )
    for name, p in world.people.items():
        qs.append(
            Question(
                f"In which country was {name} born?",
                _country_answers(world.cities[p.birthplace].country),
                (h.birthplace(name), h.country_of(p.birthplace)),
            )
        )
    for title, w in world.works.items():
        qs.append(
            Question(
                f"Where was the author of {title} born?",
                (world.people[w.author].birthplace,),
                (h.author(title), h.birthplace(w.author)),
            )
        )
    return qs


@dataclass(frozen=True)
class QASplits:
    train: list[tuple[str, Question]]  # (data_source, question); data_source is "nq" or "hotpotqa" as in Search-R1
    test: dict[str, list[Question]]  # benchmark -> questions


def split_questions(world: World, seed: int, n_train: int = 400, n_test: int = 20) -> QASplits:
    """Disjoint questions: each test set draws first, the train split gets the rest (60% single-hop)."""
    rng = random.Random(seed + 2)
    single = single_hop_questions(world)
    multi = two_hop_questions(world)
    rng.shuffle(single)
    rng.shuffle(multi)
    test: dict[str, list[Question]] = {}
    for bench in BENCHMARKS:
        pool = single if bench in SINGLE_HOP else multi
        if len(pool) < n_test:
            raise ValueError(f"only {len(pool)} questions left for {bench}; enlarge the world")
        test[bench], pool[:] = pool[:n_test], pool[n_test:]
    n_single = min(len(single), int(n_train * 0.6))
    n_multi = min(len(multi), n_train - n_single)
    train = [("nq", q) for q in single[:n_single]] + [("hotpotqa", q) for q in multi[:n_multi]]
    rng.shuffle(train)
    return QASplits(train, test)
