"""What one generated turn asks for (pure function; Search-R1's first-match rule)."""

from __future__ import annotations

import re

_ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

SEARCHR1_STOPS = ("</search>", "</answer>")


def parse_action(text: str, finish_reason: str | None) -> tuple[str, str | None]:
    """-> ("search", query) | ("answer", answer) | ("eos", None) | ("invalid", None).

    The first complete `<search>…</search>` or `<answer>…</answer>` block decides; without one, a turn that
    ended on EOS ends the trajectory and anything else (length, a stray stop) is an invalid action.
    """
    match = _ACTION_RE.search(text)
    if match:
        return match.group(1), match.group(2).strip()
    if finish_reason == "eos":
        return "eos", None
    return "invalid", None


def with_required_stops(stop: list[str]) -> list[str]:
    """The configured stop strings plus `</search>` and `</answer>` (the loop depends on both)."""
    merged = list(stop)
    for required in SEARCHR1_STOPS:
        if required not in merged:
            merged.append(required)
    return merged
