"""The texts of the MMSearch-R1 loop: the first-round instruction, the observation frames, the after-search
instructions. The built-in wording is the project's own; every text can be replaced from the YAML
(`agentloop.mmsearch.prompts.*`: the text itself, or the path of a text file or of a pickle holding one string,
such as the official `mmsearch_r1/prompts/*.pkl`, read by the restricted unpickler that runs no code).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rlinf_ext.tools.safe_pickle import CacheUnpickler

ROUND_1 = (
    "Answer the question about the image. First think inside <reason> and </reason>. If the image alone is not "
    "enough, end your turn with <search><img></search> to look the image up on the web, or with "
    "<text_search> query </text_search> to search for text. Once you know, give the answer inside <answer> and "
    "</answer>, in a few words.\nImage and question:\n"
)
AFTER_IMAGE_SEARCH = (
    "Use the image search results if they help. Think inside <reason> and </reason>, then either answer inside "
    "<answer> and </answer> or search for text with <text_search> query </text_search>."
)
AFTER_TEXT_SEARCH = (
    "Use the text search results if they help. Think inside <reason> and </reason>, then give the answer inside "
    "<answer> and </answer>."
)
IMAGE_RESULTS_HEADER = (
    "[Image search] Web pages showing this image, most relevant first; each gives its main picture and title:\n"
)
TEXT_RESULTS_HEADER = "[Text search] Summaries of the most relevant pages, most relevant first:\n"
SEARCH_FAILED = "The search returned nothing usable ({error}). Answer with what you already know.\n"
OBSERVATION = "Search results: <information>{results}</information>\nQuestion: {question}\n{instruction}"


@dataclass(frozen=True)
class Prompts:
    """Every text of the loop; `{question}`, `{error}`, `{results}`, `{instruction}` are filled in (by
    `str.replace`, so other braces are kept as written)."""

    round_1: str = ROUND_1
    after_image_search: str = AFTER_IMAGE_SEARCH
    after_text_search: str = AFTER_TEXT_SEARCH
    image_results_header: str = IMAGE_RESULTS_HEADER
    text_results_header: str = TEXT_RESULTS_HEADER
    search_failed: str = SEARCH_FAILED
    observation: str = OBSERVATION  # the user turn after a search: {results}, {question}, {instruction}

    @classmethod
    def from_config(cls, section: Any) -> "Prompts":
        """Built-in texts, replaced by every non-null key of `agentloop.mmsearch.prompts`."""
        values = {}
        for f in fields(cls):
            value = getattr(section, f.name, None) if section is not None else None
            if value is not None:
                values[f.name] = read_prompt(value, f"agentloop.mmsearch.prompts.{f.name}")
        return cls(**values)


def read_prompt(value: str, key: str) -> str:
    """A prompt given as text, a text file's path, or the path of a pickle holding one string."""
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string (the text or a file path), got {type(value).__name__}")
    path = Path(value)
    if "\n" in value or len(value) > 4096 or not path.is_file():
        return value
    if path.suffix == ".pkl":
        text = CacheUnpickler(io.BytesIO(path.read_bytes())).load()
        if not isinstance(text, str):
            raise ValueError(f"{key}: {path} must hold one pickled string, got {type(text).__name__}")
        return text
    return path.read_text(encoding="utf-8")
