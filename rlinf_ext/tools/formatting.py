"""Observation text and ids: format retrieved documents, truncate by tokens, keep the closing tag.

Search-R1 style (default):  `\\n\\n<information>Doc 1(Title: T) text\\nDoc 2(Title: T) text</information>\\n\\n`
(Search-R1 strips the block, so no newline before `</information>`)
RLinf style:                `\\n\\n<information>[Doc 1](url):\\ntext\\n\\n[Doc 2](url):\\n…</information>\\n\\n`
Truncation cuts only the body between the tags, so the observation always ends with `</information>`
(Search-R1 cuts the whole observation to 500 tokens and can drop the tag).
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
    """Wrap `body` in `<information>` tags and tokenise it; cut the body's tokens so the whole observation
    is at most `max_obs_length` tokens while both tags survive."""
    open_ids, close_ids = _encode(tokenizer, OPEN_TAG), _encode(tokenizer, CLOSE_TAG)
    body_ids = _encode(tokenizer, body)
    truncated = False
    if max_obs_length is not None:
        room = max_obs_length - len(open_ids) - len(close_ids)
        if room < 0:
            raise ValueError(
                f"agentloop.max_obs_length={max_obs_length} cannot hold the <information> tags "
                f"({len(open_ids) + len(close_ids)} tokens); raise it"
            )
        if len(body_ids) > room:
            body_ids, truncated = body_ids[:room], True
    ids = open_ids + body_ids + close_ids
    return Observation(ids=ids, text=tokenizer.decode(ids), truncated=truncated)


def build_invalid_action_observation(tokenizer: Any, message: str) -> Observation:
    """The environment's invalid-action text (``agent/searchr1/protocol.py:invalid_action_message``), tokenised."""
    return Observation(ids=_encode(tokenizer, message), text=message, truncated=False)
