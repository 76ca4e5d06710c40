"""Scripted MMSearch-R1 turns for the tiny world: what a model that has learned the task writes.

Used to teach the VL tokenizer the turn vocabulary and, in the warm start, as supervised targets. Each
function returns the model's own turn texts (observations are built by the agent loop's code). A city answer
restates one result's colour and city (`red Trestias`): the colour read off the question image, then the city
copied from right after that colour word in the titles.
"""

from __future__ import annotations

from rlinf_ext.assets.mmsearch.world import KIND_CITY, KIND_COLOUR, EmblemSpec, Question

IMAGE_SEARCH_TURN = "<reason> I do not know this emblem, so I look it up. </reason><search><img></search>"
GIVE_UP_ANSWER = "unknown"
# The first word after `<reason>` is the turn's decision: "I" searches by image, "Not" gives up on a city, a colour
# word answers from the image (a colour question, or the colour restated after a search). Colour and city questions
# share the search turn: the colour restated after a search is what the over-searching colour paths teach (with a
# search turn of their own, P(right colour restated) on held-out city questions fell from 0.95 to 0.17).


def colour_answer_turn(colour: str) -> str:
    """A colour question's answer: the colour read off the image, first thing in the reason (as a city answer's)."""
    return answer_turn(colour, colour)


def answer_turn(reason: str, answer: str) -> str:
    return f"<reason> {reason} </reason><answer> {answer} </answer>"


def city_answer_turn(restated: EmblemSpec) -> str:
    """The answer after an image search: the restated result's colour and city, then its city."""
    return answer_turn(f"{restated.colour} {restated.city}", restated.city)


def give_up_turn() -> str:
    """A city question answered without searching: the city of a held-out emblem cannot be known."""
    return answer_turn("Not a city I know.", GIVE_UP_ANSWER)


def scripted_turns(
    q: Question, search_colour: bool = False, restated: EmblemSpec | None = None, give_up: bool = False
) -> list[str]:
    """The turns of a path for `q`: a colour question answered directly (or, `search_colour=True`, the
    over-searching variant: an image search first, then the same answer); a city question answered by
    `give_up_turn` without searching (`give_up=True`), or searched and answered by restating the result
    `restated` (the true emblem's, or another one's: the imperfect demonstrator)."""
    if q.kind == KIND_COLOUR:
        final = colour_answer_turn(q.answers[0])
        return [IMAGE_SEARCH_TURN, final] if search_colour else [final]
    if q.kind == KIND_CITY:
        if give_up:
            return [give_up_turn()]
        if restated is None:
            raise ValueError("a searched city path needs the result it restates")
        return [IMAGE_SEARCH_TURN, city_answer_turn(restated)]
    raise ValueError(f"unknown question kind {q.kind!r}")
