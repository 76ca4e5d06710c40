"""Search-R1 response well-formedness (pure function).

A well-formed response is
    <think>…</think> ( <search>…</search> <information>…</information> <think>…</think> )* <answer>…</answer>
with only whitespace between blocks and nothing after the answer (special tokens such as `<|im_end|>` are
ignored). The `<information>` block may be absent, so the model's own text (observations left out, as the
reward workers pass it) is judged by the same rule. Anything else, including an invalid-action message
inserted by the environment, is malformed.
"""

from __future__ import annotations

import re

_TAG_RE = re.compile(r"(</?(?:think|search|information|answer)>)")
_SPECIAL_TOKEN_RE = re.compile(r"<\|[^|>]*\|>")

# state -> {tag: next state}; "in_*" states accept any text, the others only whitespace.
_TRANSITIONS: dict[str, dict[str, str]] = {
    "start": {"<think>": "in_think"},
    "in_think": {"</think>": "after_think"},
    "after_think": {"<search>": "in_search", "<answer>": "in_answer"},
    "in_search": {"</search>": "after_search"},
    "after_search": {"<information>": "in_information", "<think>": "in_think"},
    "in_information": {"</information>": "after_information"},
    "after_information": {"<think>": "in_think"},
    "in_answer": {"</answer>": "end"},
    "end": {},
}


def is_well_formed(response: str) -> bool:
    """True when the response follows the Search-R1 think/search/information/answer grammar."""
    state = "start"
    for part in _TAG_RE.split(_SPECIAL_TOKEN_RE.sub("", response)):
        if not part:
            continue
        if _TAG_RE.fullmatch(part):
            next_state = _TRANSITIONS[state].get(part)
            if next_state is None:
                return False
            state = next_state
        elif not state.startswith("in_") and part.strip():
            return False  # stray text between blocks
    return state == "end"
