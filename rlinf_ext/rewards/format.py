"""Search-R1 response well-formedness over a set of tool tags (pure function).

A well-formed response is
    <think>…</think> ( <T>…</T> <information>…</information> <think>…</think> )* <answer>…</answer>
where each ``T`` is one of the tool tags (Search-R1's: ``search``), with only whitespace between blocks and nothing
after the answer (special tokens such as `<|im_end|>` are ignored). The `<information>` block may be absent, so the
model's own text (observations left out, as the reward workers pass it) is judged by the same rule. Anything else,
including an invalid-action message inserted by the environment or a tag of a tool that is not in the set, is
malformed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

DEFAULT_TOOL_TAGS: tuple[str, ...] = ("search",)  # Search-R1's own tool
_SPECIAL_TOKEN_RE = re.compile(r"<\|[^|>]*\|>")


@lru_cache(maxsize=32)
def _grammar(tool_tags: tuple[str, ...]) -> tuple[re.Pattern, dict[str, dict[str, str]]]:
    """The tag pattern and the transitions (state -> {tag: next state}); "in_*" states accept any text, the others
    only whitespace."""
    names = ("think", "information", "answer", *tool_tags)
    tag_re = re.compile(r"(</?(?:" + "|".join(re.escape(n) for n in names) + r")>)")
    transitions: dict[str, dict[str, str]] = {
        "start": {"<think>": "in_think"},
        "in_think": {"</think>": "after_think"},
        "after_think": {"<answer>": "in_answer", **{f"<{t}>": f"in_tool:{t}" for t in tool_tags}},
        "after_tool": {"<information>": "in_information", "<think>": "in_think"},
        "in_information": {"</information>": "after_information"},
        "after_information": {"<think>": "in_think"},
        "in_answer": {"</answer>": "end"},
        "end": {},
        **{f"in_tool:{t}": {f"</{t}>": "after_tool"} for t in tool_tags},
    }
    return tag_re, transitions


def is_well_formed(response: str, tools: Sequence[str] = DEFAULT_TOOL_TAGS) -> bool:
    """True when the response follows the think/tool/information/answer grammar; ``tools``: the tool tag names
    (``Tool.tag_name()``) a response may use."""
    tag_re, transitions = _grammar(tuple(tools))
    state = "start"
    for part in tag_re.split(_SPECIAL_TOKEN_RE.sub("", response)):
        if not part:
            continue
        if tag_re.fullmatch(part):
            next_state = transitions[state].get(part)
            if next_state is None:
                return False
            state = next_state
        elif not state.startswith("in_") and part.strip():
            return False  # stray text between blocks
    return state == "end"
