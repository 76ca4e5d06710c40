"""Emblems for the invented cities, drawn with PIL, the two kinds of question asked about them, and the image search.

Every city of `assets/core/world.py` gets an emblem: a colour from a 6-colour palette (the signal a tiny vision tower can
learn from pixels), a shape and a pattern (which make emblems distinct but need not be recognised). Each
question image and each search thumbnail is an independent jitter of the emblem (size, position, colour
within +-20), as web thumbnails differ from the query image.

The image search shows the true emblem at a uniformly random rank among two emblems of other, distinct colours, each
titled `red Trestias emblem`: the colour word right before the city. A model that reads the question image's colour
and copies the city after that colour word in the titles answers right (the copy one induction head makes); the
rank carries no signal, and held-out cities (never an answer in training) cannot be recalled.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlinf_ext.assets.core.world import World

PALETTE = {
    "red": (215, 45, 45),
    "green": (45, 165, 70),
    "blue": (50, 85, 215),
    "yellow": (230, 205, 40),
    "purple": (140, 60, 180),
    "orange": (240, 140, 30),
}
SHAPES = ("circle", "square", "triangle")
PATTERNS = ("plain", "stripes", "border")
EMBLEM_SIDE = 56  # canonical: 2x2 blocks of 28 pixels = 4 language-model tokens

KIND_COLOUR, KIND_CITY = "colour", "city"
TITLE_SUFFIX = " emblem"


@dataclass(frozen=True)
class EmblemSpec:
    city: str
    country: str
    colour: str
    shape: str
    pattern: str

    @property
    def title(self) -> str:
        return title_of(self.colour, self.city)


def title_of(colour: str, city: str) -> str:
    return f"{colour} {city}{TITLE_SUFFIX}"


def parse_title(title: str) -> tuple[str, str]:
    """(colour, city) of a title written by `title_of`."""
    colour, city = title.removesuffix(TITLE_SUFFIX).split(" ", 1)
    return colour, city


def emblem_specs(world: World, seed: int) -> dict[str, EmblemSpec]:
    """One emblem per city, colours spread evenly over the palette."""
    rng = random.Random(seed + 11)
    cities = sorted(world.cities)
    colours = [list(PALETTE)[i % len(PALETTE)] for i in range(len(cities))]
    rng.shuffle(colours)
    return {
        c: EmblemSpec(c, world.cities[c].country, colours[i], rng.choice(SHAPES), rng.choice(PATTERNS))
        for i, c in enumerate(cities)
    }


def draw_emblem(spec: EmblemSpec, rng: random.Random, side: int = EMBLEM_SIDE):
    """A jittered drawing of `spec` as an RGB PIL image of `side` x `side` pixels."""
    from PIL import Image, ImageDraw

    background = tuple(rng.randint(225, 255) for _ in range(3))
    image = Image.new("RGB", (side, side), background)
    draw = ImageDraw.Draw(image)
    colour = tuple(max(0, min(255, v + rng.randint(-20, 20))) for v in PALETTE[spec.colour])
    size = rng.uniform(0.62, 0.86) * side
    x0 = rng.uniform(0, side - size)
    y0 = rng.uniform(0, side - size)
    box = (x0, y0, x0 + size, y0 + size)
    outline = (20, 20, 20) if spec.pattern == "border" else None
    width = 3 if spec.pattern == "border" else 1
    if spec.shape == "circle":
        draw.ellipse(box, fill=colour, outline=outline, width=width)
    elif spec.shape == "square":
        draw.rectangle(box, fill=colour, outline=outline, width=width)
    else:
        draw.polygon([(x0 + size / 2, y0), (x0, y0 + size), (x0 + size, y0 + size)], fill=colour, outline=outline)
    if spec.pattern == "stripes":
        for k in range(1, 4):
            y = y0 + k * size / 4
            draw.line([(x0 + size * 0.2, y), (x0 + size * 0.8, y)], fill=background, width=2)
    return image


@dataclass(frozen=True)
class Question:
    """One FVQA-style question about an emblem."""

    kind: str  # colour | city
    city: str
    question: str
    answers: tuple[str, ...]

    @property
    def category(self) -> str:
        return "search_free" if self.kind == KIND_COLOUR else "search_required"


COLOUR_QUESTION = "What colour is the emblem in the image?"
CITY_QUESTION = "Which city has this emblem?"


def questions_for(specs: dict[str, EmblemSpec], city: str) -> list[Question]:
    """The two kinds for one city: colour (no search needed), city (image search, then read the titles)."""
    return [
        Question(KIND_COLOUR, city, COLOUR_QUESTION, (specs[city].colour,)),
        Question(KIND_CITY, city, CITY_QUESTION, (city,)),
    ]


def split_cities(world: World, seed: int, n_test: int = 20) -> tuple[list[str], list[str]]:
    """(train cities, held-out test cities); distractor cities get no questions, as in the text world."""
    rng = random.Random(seed + 12)
    cities = sorted(c for c in world.cities if c not in world.distractor_cities)
    rng.shuffle(cities)
    return sorted(cities[n_test:]), sorted(cities[:n_test])


def search_hits(specs: dict[str, EmblemSpec], city: str, rng: random.Random, topk: int = 3) -> list[EmblemSpec]:
    """Ranked image-search results for an emblem of `city`: the true emblem at a uniformly random rank among
    `topk - 1` other cities whose colours differ from it and from each other."""
    return [specs[c] for c in _ranked(specs, city, rng, topk, keep_true=True)]


def ablated_hits(specs: dict[str, EmblemSpec], city: str, rng: random.Random, topk: int = 3) -> list[EmblemSpec]:
    """The tool-ablation control's results: `topk` other cities of distinct colours, none of the true emblem's
    colour, so no title names the city or carries its colour."""
    return [specs[c] for c in _ranked(specs, city, rng, topk, keep_true=False)]


def _ranked(specs: dict[str, EmblemSpec], city: str, rng: random.Random, topk: int, keep_true: bool) -> list[str]:
    colours = {specs[city].colour}
    picked: list[str] = []
    for other in rng.sample(sorted(specs), len(specs)):
        if other != city and specs[other].colour not in colours:
            picked.append(other)
            colours.add(specs[other].colour)
        if len(picked) == topk - (1 if keep_true else 0):
            break
    if keep_true:
        picked.insert(rng.randrange(topk), city)
    return picked


def permuted_titles(hits: list[EmblemSpec], rng: random.Random) -> list[str]:
    """The title-permutation control's titles: each thumbnail keeps its colour word, the cities are shuffled among
    the results (uniformly, so a title keeps its own city 1 time in `len(hits)`: reading gives chance)."""
    cities = [h.city for h in hits]
    rng.shuffle(cities)
    return [title_of(h.colour, c) for h, c in zip(hits, cities)]
