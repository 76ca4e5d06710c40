"""Emblems for the invented cities, drawn with PIL, and the three kinds of question asked about them.

Every city of `assets/core/world.py` gets an emblem: a colour from a 6-colour palette (the signal a tiny vision tower can
learn from pixels), a shape and a pattern (which make emblems distinct but need not be recognised). Each
question image and each search thumbnail is an independent jitter of the emblem (size, position, colour
within +-20), as web thumbnails differ from the query image.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlinf_ext.assets.core.world import World

PALETTE = {"red": (215, 45, 45), "green": (45, 165, 70), "blue": (50, 85, 215),
           "yellow": (230, 205, 40), "purple": (140, 60, 180), "orange": (240, 140, 30)}
SHAPES = ("circle", "square", "triangle")
PATTERNS = ("plain", "stripes", "border")
EMBLEM_SIDE = 56  # canonical: 2x2 blocks of 28 pixels = 4 language-model tokens

KIND_COLOUR, KIND_CITY, KIND_ATTRIBUTE = "colour", "city", "attribute"


@dataclass(frozen=True)
class EmblemSpec:
    city: str
    country: str
    colour: str
    shape: str
    pattern: str

    @property
    def title(self) -> str:
        return f"Emblem of {self.city} - {self.country}"


def emblem_specs(world: World, seed: int) -> dict[str, EmblemSpec]:
    """One emblem per city, colours spread evenly over the palette."""
    rng = random.Random(seed + 11)
    cities = sorted(world.cities)
    colours = [list(PALETTE)[i % len(PALETTE)] for i in range(len(cities))]
    rng.shuffle(colours)
    return {c: EmblemSpec(c, world.cities[c].country, colours[i], rng.choice(SHAPES), rng.choice(PATTERNS))
            for i, c in enumerate(cities)}


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
    """One FVQA-style question about an emblem; `query` is the text search a 3-turn answer needs."""

    kind: str  # colour | city | attribute
    city: str
    question: str
    answers: tuple[str, ...]
    query: str | None = None

    @property
    def category(self) -> str:
        return "search_free" if self.kind == KIND_COLOUR else "search_required"


def _attribute_question(world: World, city: str, rng: random.Random) -> Question:
    c = world.cities[city]
    river = world.rivers[c.river].title
    options = [
        ("In which year was the city with this emblem founded?", (str(c.founded),), f"{city} founded year"),
        ("Which river flows through the city with this emblem?", (river, river.removesuffix(" River")),
         f"river through {city}"),
        ("Who founded the city with this emblem?", (c.founder,), f"founder of {city}"),
    ]
    question, answers, query = rng.choice(options)
    return Question(KIND_ATTRIBUTE, city, question, answers, query)


def questions_for(world: World, specs: dict[str, EmblemSpec], city: str, rng: random.Random) -> list[Question]:
    """The three kinds for one city: colour (no search), city (image search), an attribute (both searches)."""
    return [
        Question(KIND_COLOUR, city, "What colour is the emblem in the image?", (specs[city].colour,)),
        Question(KIND_CITY, city, "Which city has this emblem?", (city,)),
        _attribute_question(world, city, rng),
    ]


def split_cities(world: World, seed: int, n_test: int = 12) -> tuple[list[str], list[str]]:
    """(train cities, held-out test cities); distractor cities get no questions, as in the text world."""
    rng = random.Random(seed + 12)
    cities = sorted(c for c in world.cities if c not in world.distractor_cities)
    rng.shuffle(cities)
    return sorted(cities[n_test:]), sorted(cities[:n_test])


def search_hits(specs: dict[str, EmblemSpec], city: str, rng: random.Random, topk: int = 3) -> list[EmblemSpec]:
    """Ranked image-search results for an emblem of `city`: the true emblem (rank 1 in 80% of cases, else 2),
    one other city with the same colour and other cities, so the titles must be read."""
    same = sorted(c for c, s in specs.items() if c != city and s.colour == specs[city].colour)
    other = sorted(c for c, s in specs.items() if s.colour != specs[city].colour)
    distractors = [rng.choice(same)] + rng.sample(other, topk - 2)
    rng.shuffle(distractors)
    ranked = list(distractors)
    ranked.insert(0 if rng.random() < 0.8 else 1, city)
    return [specs[c] for c in ranked[:topk]]
