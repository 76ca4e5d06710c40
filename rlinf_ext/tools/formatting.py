"""Observation text and ids: format retrieved documents, truncate by tokens, keep the closing tag.

Search-R1 style (default):  `\\n\\n<information>Doc 1(Title: T) text\\nDoc 2(Title: T) text</information>\\n\\n`
(Search-R1 strips the block, so no newline before `</information>`)
RLinf style:                `\\n\\n<information>[Doc 1](url):\\ntext\\n\\n[Doc 2](url):\\n…</information>\\n\\n`
An observation that fits is tokenised as one string, as Search-R1 does (its ids then match Search-R1's, whose BPE
merges across the tag edges: `>Doc`, `.</`). One that does not is cut in its body only, so it still ends with
`</information>` (Search-R1 cuts the whole observation to 500 tokens and can drop the tag; docs/searchr1-facts.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlinf_ext.tools.documents import Document

SEARCHR1_STYLE, RLINF_STYLE = "searchr1", "rlinf"  # tools.search.observation_format
OBSERVATION_FORMATS = (SEARCHR1_STYLE, RLINF_STYLE)
OPEN_TAG = "\n\n<information>"
CLOSE_TAG = "</information>\n\n"


def format_documents(docs: Sequence[Document], style: str = SEARCHR1_STYLE) -> str:
    if style == SEARCHR1_STYLE:
        # Search-R1 shows the title with the quotes of the corpus contents: Doc 1(Title: "T") text
        # and strips the joined block, so no newline precedes </information> (search_r1/llm_agent/generation.py)
        return "\n".join(f'Doc {i + 1}(Title: "{doc.title}") {doc.text}' for i, doc in enumerate(docs)).strip()
    if style == RLINF_STYLE:
        return "\n".join(f"[Doc {i + 1}]({doc.url or ''}):\n{doc.text}\n" for i, doc in enumerate(docs))
    raise ValueError(f"tools.search.observation_format must be one of {OBSERVATION_FORMATS}, got {style!r}")


def search_failed_text(error: str) -> str:
    return f"The search failed ({error}). No results are available for this query."


@dataclass
class Observation:
    ids: list[int]
    text: str
    truncated: bool


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def build_observation(tokenizer: Any, body: str, max_obs_length: int | None) -> Observation:
    """Wrap `body` in `<information>` tags and tokenise it as one string; when that exceeds `max_obs_length`
    tokens, cut the body's own tokens instead so that both tags survive."""
    open_ids, close_ids = _encode(tokenizer, OPEN_TAG), _encode(tokenizer, CLOSE_TAG)
    room = None if max_obs_length is None else max_obs_length - len(open_ids) - len(close_ids)
    if room is not None and room < 0:
        raise ValueError(
            f"agentloop.max_obs_length={max_obs_length} cannot hold the <information> tags "
            f"({len(open_ids) + len(close_ids)} tokens); raise it"
        )
    whole = _encode(tokenizer, OPEN_TAG + body + CLOSE_TAG)
    if max_obs_length is None or len(whole) <= max_obs_length:
        return Observation(ids=whole, text=tokenizer.decode(whole), truncated=False)
    ids = open_ids + _encode(tokenizer, body)[:room] + close_ids
    return Observation(ids=ids, text=tokenizer.decode(ids), truncated=True)


def build_invalid_action_observation(tokenizer: Any, message: str) -> Observation:
    """The environment's invalid-action text (``agent/searchr1/protocol.py:invalid_action_message``), tokenised."""
    return Observation(ids=_encode(tokenizer, message), text=message, truncated=False)
