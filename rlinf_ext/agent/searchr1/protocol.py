"""Search-R1's turn protocol over a list of tools (pure): what a generated turn asks for (the first complete
``<tag>…</tag>`` block among the tools' tags and ``<answer>``), the strings the engine must stop at, and the
invalid-action text. Reads only the tools' class facts (``tools/base.py``), so the agent registry and the config
checks import it cheaply.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlinf_ext.tools.base import Tool

# a turn's action (``TurnRecord.action``) is a tool's name or one of these
ANSWER, EOS, INVALID, TOOL_DISABLED = "answer", "eos", "invalid", "tool_disabled"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
ANSWER_LINE = "If I want to give the final answer, I should put the answer between <answer> and </answer>."
DEFAULT_TOOLS: tuple[str, ...] = ("search",)  # agentloop.searchr1.tools' default (config/schema.py)
# The default tools' stops and the answer's (what the agent registry states; tests check it against TurnProtocol)
SEARCHR1_STOPS = ("</search>", ANSWER_CLOSE)


def invalid_action_message(tools: Sequence[type[Tool] | Tool]) -> str:
    """The environment's reply to a turn with no complete action: one sentence per tool, then the answer's.
    For the default tools it is Search-R1's own text, byte for byte."""
    lines = [tool.invalid_action_line() for tool in tools] + [ANSWER_LINE]
    return f"\nMy previous action is invalid. {' '.join(lines)} Let me try again.\n"


@dataclass(frozen=True)
class TurnProtocol:
    """The protocol of one tool list (tool classes or built tools; only their class facts are read)."""

    tools: tuple = ()
    _by_tag: dict = field(init=False, repr=False, compare=False)
    _action_re: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_tag = {tool.tag_name(): tool.name for tool in self.tools}
        alternatives = "|".join(re.escape(tag) for tag in [*by_tag, ANSWER])
        object.__setattr__(self, "_by_tag", by_tag)
        object.__setattr__(self, "_action_re", re.compile(rf"<({alternatives})>(.*?)</\1>", re.DOTALL))

    @classmethod
    def of(cls, tools: Sequence[type[Tool] | Tool]) -> "TurnProtocol":
        return cls(tuple(tools))

    @property
    def stops(self) -> tuple[str, ...]:
        """Every tool's stops, then ``</answer>`` (the loop acts only when a turn ends at one of them)."""
        out: list[str] = []
        for tool in self.tools:
            out += [s for s in tool.stops() if s not in out]
        return (*out, ANSWER_CLOSE) if ANSWER_CLOSE not in out else tuple(out)

    @property
    def invalid_action_message(self) -> str:
        return invalid_action_message(self.tools)

    def parse(self, text: str, finish_reason: str | None) -> tuple[str, str | None]:
        """-> (tool name, its input) | ("answer", answer) | ("eos", None) | ("invalid", None).

        The first complete tool or answer block decides; without one, a turn that ended on EOS is ``eos`` (the
        loop's ``on_no_action`` says whether it ends the trajectory) and anything else (length, a stray stop) is an
        invalid action.
        """
        match = self._action_re.search(text)
        if match:
            tag = match.group(1)
            return (ANSWER if tag == ANSWER else self._by_tag[tag]), match.group(2).strip()
        if finish_reason == EOS:
            return EOS, None
        return INVALID, None

    def with_required_stops(self, stop: Sequence[str]) -> list[str]:
        """The configured stop strings plus the protocol's (the loop depends on them)."""
        merged = list(stop)
        merged += [s for s in self.stops if s not in merged]
        return merged
