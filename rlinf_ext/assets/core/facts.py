"""The sentence that states each fact, shared by the corpus and the questions.

A fact is `prefix + " " + answer + "."` and appears verbatim in the entity's passage. The warm-start
trajectories restate the fact in `<think>` after reading it, so that answering is "find the sentence that
starts like this and continue it" — the copy a tiny model can learn in minutes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fact:
    prefix: str  # e.g. "The capital of Velmora is"
    answer: str  # e.g. "Tarsk"

    @property
    def sentence(self) -> str:
        return f"{self.prefix} {self.answer}."


def capital(country: str, city: str) -> Fact:
    return Fact(f"The capital of {country} is", city)


def language(country: str, lang: str) -> Fact:
    return Fact(f"The official language of {country} is", lang)


def currency(country: str, cur: str) -> Fact:
    return Fact(f"The currency of {country} is the", cur)


def city_country(city: str, country: str) -> Fact:
    return Fact(f"{city} is a city in the country of", country)


def city_river(city: str, river_title: str) -> Fact:
    return Fact(f"The river that flows through {city} is the", river_title)  # e.g. "Talo River"


def city_founder(city: str, person: str) -> Fact:
    return Fact(f"The city of {city} was founded by", person)


def city_year(city: str, year: int) -> Fact:
    return Fact(f"The city of {city} was founded in the year", str(year))


def birthplace(person: str, city: str) -> Fact:
    return Fact(f"{person} was born in the city of", city)


def birth_year(person: str, year: int) -> Fact:
    return Fact(f"{person} was born in the year", str(year))


def author(work: str, person: str) -> Fact:
    return Fact(f"The author of {work} is", person)


def river_sea(river: str, sea: str) -> Fact:
    return Fact(f"The {river} River flows into the", sea)
