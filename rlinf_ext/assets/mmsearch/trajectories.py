"""Scripted MMSearch-R1 turns for the tiny world: what a model that has learned the task writes.

Used to teach the VL tokenizer the turn vocabulary and, in the warm start, as supervised targets. Each
function returns the model's own turn texts (observations are built by the agent loop's code).
"""

from __future__ import annotations

from rlinf_ext.assets.mmsearch.world import KIND_ATTRIBUTE, KIND_CITY, KIND_COLOUR, Question

IMAGE_SEARCH_TURN = "<reason> I do not know this emblem, so I look it up. </reason><search><img></search>"


def answer_turn(reason: str, answer: str) -> str:
    return f"<reason> {reason} </reason><answer> {answer} </answer>"


def text_search_turn(city: str, query: str) -> str:
    return f"<reason> The emblem belongs to {city}. </reason><text_search> {query} </text_search>"


def scripted_turns(q: Question, search_colour: bool = False) -> list[str]:
    """The turns of the intended path for `q`; `search_colour=True` gives the over-searching variant of a
    colour question (an image search first, then the same answer)."""
    if q.kind == KIND_COLOUR:
        final = answer_turn(f"The emblem is {q.answers[0]}.", q.answers[0])
        return [IMAGE_SEARCH_TURN, final] if search_colour else [final]
    if q.kind == KIND_CITY:
        return [IMAGE_SEARCH_TURN, answer_turn("The results name the city.", q.answers[0])]
    if q.kind == KIND_ATTRIBUTE:
        return [IMAGE_SEARCH_TURN, text_search_turn(q.city, q.query),
                answer_turn("The page gives the answer.", q.answers[0])]
    raise ValueError(f"unknown question kind {q.kind!r}")
