"""An invented world of countries, cities, people, rivers, seas and books, drawn from a seed.

Every name is a random pronounceable word, so no fact about this world can be guessed from general
knowledge: a model can only answer questions about it by reading the corpus built from it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_ONSETS = [
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "st",
    "t",
    "tr",
    "v",
    "z",
]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ia", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "m", "k"]
OCCUPATIONS = [
    "painter",
    "astronomer",
    "merchant",
    "poet",
    "general",
    "architect",
    "physician",
    "composer",
    "sculptor",
    "explorer",
]
GENRES = ["novel", "poem", "play", "chronicle", "treatise"]


@dataclass
class Country:
    name: str
    capital: str = ""
    language: str = ""
    currency: str = ""
    cities: list[str] = field(default_factory=list)


@dataclass
class City:
    name: str
    country: str
    river: str
    founder: str
    founded: int


@dataclass
class Person:
    name: str
    birthplace: str
    born: int
    occupation: str
    founded: str | None = None  # city this person founded
    works: list[str] = field(default_factory=list)


@dataclass
class River:
    name: str  # bare name, e.g. "Talo"; the page title is "Talo River"
    sea: str
    cities: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.name} River"


@dataclass
class Work:
    title: str
    author: str
    genre: str
    year: int


@dataclass
class World:
    countries: dict[str, Country]
    cities: dict[str, City]
    people: dict[str, Person]
    rivers: dict[str, River]
    seas: list[str]
    works: dict[str, Work]
    # entities that get a page but no question: they make retrieval harder without adding answers
    distractor_cities: set[str]
    distractor_people: set[str]


class NameMaker:
    """Unique random pronounceable names (case-insensitively unique across the whole world)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, min_syl: int = 2, max_syl: int = 3) -> str:
        for _ in range(1000):
            syl = self.rng.randint(min_syl, max_syl)
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syl)]
            w = ("".join(parts) + self.rng.choice(_CODAS)).capitalize()
            if w.lower() not in self.used and len(w) >= 4:
                self.used.add(w.lower())
                return w
        raise RuntimeError("name space exhausted; lower the entity counts")


def build_world(
    seed: int,
    n_countries: int = 24,
    cities_per_country: int = 3,
    n_rivers: int = 30,
    n_seas: int = 8,
    n_authors: int = 50,
    distractor_fraction: float = 0.2,
) -> World:
    rng = random.Random(seed)
    names = NameMaker(rng)
    seas = [f"Sea of {names.word()}" for _ in range(n_seas)]
    rivers = {r.name: r for r in (River(names.word(2, 2), rng.choice(seas)) for _ in range(n_rivers))}
    river_names = list(rivers)
    countries: dict[str, Country] = {}
    cities: dict[str, City] = {}
    people: dict[str, Person] = {}

    def new_person(birthplace: str, born: int) -> Person:
        p = Person(f"{names.word(2, 2)} {names.word(2, 3)}", birthplace, born, rng.choice(OCCUPATIONS))
        people[p.name] = p
        return p

    for _ in range(n_countries):
        c = Country(names.word(), language=names.word(2, 2) + "ish", currency=names.word(1, 2).lower())
        countries[c.name] = c
        for _ in range(cities_per_country):
            cname = names.word()
            river = rng.choice(river_names)
            founded = rng.randint(900, 1800)
            cities[cname] = City(cname, c.name, river, founder="", founded=founded)
            rivers[river].cities.append(cname)
            c.cities.append(cname)
        c.capital = c.cities[0]
    city_names = list(cities)
    # founders: born somewhere (another city, so that hops do not collapse) 20-60 years before the founding
    for cname, city in cities.items():
        birthplace = rng.choice([x for x in city_names if x != cname])
        founder = new_person(birthplace, city.founded - rng.randint(20, 60))
        founder.founded = cname
        city.founder = founder.name
    works: dict[str, Work] = {}
    for _ in range(n_authors):
        author = new_person(rng.choice(city_names), rng.randint(1000, 1900))
        for _ in range(rng.randint(1, 2)):
            title = f"The {names.word(2, 2)} {rng.choice(['Tides', 'Crown', 'Winter', 'Road', 'Garden', 'Lantern', 'Echo'])}"
            works[title] = Work(title, author.name, rng.choice(GENRES), author.born + rng.randint(20, 60))
            author.works.append(title)
    n_dc = int(len(cities) * distractor_fraction)
    distractor_cities = set(
        rng.sample([c for c in city_names if cities[c].country and countries[cities[c].country].capital != c], n_dc)
    )
    distractor_people = set(rng.sample(sorted(people), int(len(people) * distractor_fraction)))
    return World(countries, cities, people, rivers, seas, works, distractor_cities, distractor_people)
