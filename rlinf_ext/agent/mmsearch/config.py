"""MMSearch-R1's own settings, mounted at ``agentloop.mmsearch`` (``AgentSpec.config``; defaults live here only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rlinf_ext.config.schema import fld


@dataclass
class PromptsConfig:
    round_1: Optional[str] = fld(None, "First-round instruction before the image and question (null = built-in; "
                                 "text, a text file path, or a .pkl holding one string such as the official prompts).")
    after_image_search: Optional[str] = fld(None, "Instruction after image-search results (null = built-in).")
    after_text_search: Optional[str] = fld(None, "Instruction after text-search results (null = built-in).")
    image_results_header: Optional[str] = fld(None, "First line of an image-search observation (null = built-in).")
    text_results_header: Optional[str] = fld(None, "First line of a text-search observation (null = built-in).")
    search_failed: Optional[str] = fld(None, "Observation of a failed search; {error} is filled in (null = built-in).")
    observation: Optional[str] = fld(
        None, "The user turn after a search: {results}, {question}, {instruction} (null = built-in)."
    )


@dataclass
class MMSearchConfig:
    max_gen_round: int = fld(3, "Generation turns at most (MMSearch-R1: 3; a search in the last turn ends it).")
    image_search_limit: int = fld(1, "Image searches per trajectory; one more ends the trajectory.")
    text_search_limit: int = fld(1, "Text searches per trajectory (official script: 2); one more ends it.")
    prompts: PromptsConfig = fld(PromptsConfig, "Texts of the loop (the project's own wording by default).")
