"""Wikipedia-like passages about the invented world, in Search-R1 (wiki-18) and ASearcher page form."""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlinf_ext.assets.core import facts as F
from rlinf_ext.assets.core.world import World

_FILLERS = [
    "Its markets are known for {w} cloth and dried {v}.",
    "Travellers describe the {w} hills around it as quiet in winter.",
    "A festival of {w} lanterns is held there every spring.",
    "Local records mention a long dispute over the {w} bridge.",
    "The old quarter still has houses of {w} stone.",
]


@dataclass(frozen=True)
class Passage:
    title: str
    text: str

    @property
    def contents(self) -> str:
        # Search-R1's wiki-18 rows store the title in quotes on the first line
        return f'"{self.title}"\n{self.text}'

    @property
    def url(self) -> str:
        return "https://en.wikipedia.org/wiki/" + self.title.replace(" ", "_")


def _filler(rng: random.Random) -> str:
    words = ["amber", "copper", "willow", "saffron", "slate", "cedar", "indigo", "thistle", "ochre", "juniper"]
    return rng.choice(_FILLERS).format(w=rng.choice(words), v=rng.choice(words))


def build_passages(world: World, seed: int) -> list[Passage]:
    """One page per entity, facts stated plainly, plus a filler sentence; order shuffled by the seed."""
    rng = random.Random(seed + 1)
    out: list[Passage] = []
    for c in world.countries.values():
        others = ", ".join(x for x in c.cities if x != c.capital)
        out.append(
            Passage(
                c.name,
                " ".join(
                    [
                        f"The Republic of {c.name} is a country.",
                        F.capital(c.name, c.capital).sentence,
                        F.language(c.name, c.language).sentence,
                        F.currency(c.name, c.currency).sentence,
                        f"Other cities of {c.name} include {others}.",
                    ]
                ),
            )
        )
    for city in world.cities.values():
        out.append(
            Passage(
                city.name,
                " ".join(
                    [
                        F.city_country(city.name, city.country).sentence,
                        F.city_founder(city.name, city.founder).sentence,
                        F.city_year(city.name, city.founded).sentence,
                        F.city_river(city.name, world.rivers[city.river].title).sentence,
                        _filler(rng),
                    ]
                ),
            )
        )
    for p in world.people.values():
        article = "an" if p.occupation[0] in "aeiou" else "a"
        bits = [
            f"{p.name} was {article} {p.occupation}.",
            F.birthplace(p.name, p.birthplace).sentence,
            F.birth_year(p.name, p.born).sentence,
        ]
        if p.founded:
            bits.append(f"{p.name} founded the city of {p.founded}.")
        for w in p.works:
            bits.append(f"{p.name} wrote {w}.")
        out.append(Passage(p.name, " ".join(bits)))
    for r in world.rivers.values():
        through = " and ".join(r.cities) if r.cities else "no large city"
        out.append(
            Passage(
                r.title,
                f"The {r.name} River is a river that flows through {through}. " + F.river_sea(r.name, r.sea).sentence,
            )
        )
    for sea in world.seas:
        feeders = [r.title for r in world.rivers.values() if r.sea == sea][:4]
        text = f"The {sea} is a sea." + (
            f" Rivers flowing into it include the {', '.join(feeders)}." if feeders else ""
        )
        out.append(Passage(sea, text))
    for w in world.works.values():
        out.append(
            Passage(w.title, f"{w.title} is a {w.genre} written in {w.year}. " + F.author(w.title, w.author).sentence)
        )
    rng.shuffle(out)
    return out


def wiki_rows(passages: list[Passage]) -> list[dict]:
    """Search-R1 corpus rows: ids are the row numbers as strings, as in wiki-18."""
    return [{"id": str(i), "contents": p.contents, "url": p.url} for i, p in enumerate(passages)]


def page_rows(passages: list[Passage]) -> list[dict]:
    """ASearcher page rows, one per title (passages sharing a title are joined)."""
    by_title: dict[str, list[Passage]] = {}
    for p in passages:
        by_title.setdefault(p.title, []).append(p)
    return [{"url": ps[0].url, "title": t, "contents": "\n".join(p.text for p in ps)} for t, ps in by_title.items()]
