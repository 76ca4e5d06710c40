"""The MMSearch-R1 turn protocol (pure): its action tags, the stop strings that end a turn, and what one turn asks
for, anchored at the end of the turn's own text. The reward, the config rules and the loop read it from here."""

from __future__ import annotations

import re

IMAGE_CALL = "<search><img></search>"
STOPS = ("</search>", "</text_search>", "</answer>")  # the closing tags that end a turn
_TRAILING_SPECIAL = re.compile(r"(?:\s*<\|(?:im_end|endoftext)\|>)+\s*$")
_TEXT_QUERY = re.compile(r"<text_search>(.*?)</text_search>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def clean_turn(text: str) -> str:
    """A turn's text without trailing `<|im_end|>` / `<|endoftext|>` and surrounding whitespace."""
    return _TRAILING_SPECIAL.sub("", text).strip()


def parse_action(text: str, finish_reason: str | None) -> tuple[str, str | None]:
    """-> ("image_search", None) | ("text_search", query) | ("answer", answer) | ("eos", None) | ("invalid", None).

    A search counts only when the turn *ends* with its call (after trailing `<|im_end|>`); a text search needs
    a non-empty query (the last `<text_search>` block). Anything else ends the trajectory."""
    turn = clean_turn(text)
    if turn.endswith(IMAGE_CALL):
        return "image_search", None
    if turn.endswith("</text_search>"):
        queries = _TEXT_QUERY.findall(turn)
        query = queries[-1].strip() if queries else ""
        return ("text_search", query) if query else ("invalid", None)
    answers = _ANSWER.findall(turn)
    if answers:
        return "answer", answers[-1].strip()
    return ("eos", None) if finish_reason == "eos" else ("invalid", None)


def with_stops(stop: list[str]) -> list[str]:
    """The configured stop strings plus the three the loop depends on."""
    return list(stop) + [s for s in STOPS if s not in stop]
