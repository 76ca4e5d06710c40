"""MMSearch-R1's own settings, mounted at ``agentloop.mmsearch`` (``AgentSpec.config``; defaults live here only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rlinf_ext.config.schema import fld


@dataclass
class PromptsConfig:
    round_1: Optional[str] = fld(
        None,
        "First-round instruction before the image and question (null = built-in; "
        "text, a text file path, or a .pkl holding one string such as the official prompts).",
    )
    after_image_search: Optional[str] = fld(None, "Instruction after image-search results (null = built-in).")
    after_text_search: Optional[str] = fld(None, "Instruction after text-search results (null = built-in).")
    image_results_header: Optional[str] = fld(None, "First line of an image-search observation (null = built-in).")
    text_results_header: Optional[str] = fld(None, "First line of a text-search observation (null = built-in).")
    search_failed: Optional[str] = fld(None, "Observation of a failed search; {error} is filled in (null = built-in).")
    observation: Optional[str] = fld(
        None, "The user turn after a search: {results}, {question}, {instruction} (null = built-in)."
    )


@dataclass
class RewardShapingConfig:
    """MMSearch-R1's terms of the reward beyond the shared ``reward`` section (``reward.search_penalty`` and
    ``reward.scoring`` stay there: the Search-R1 reward reads them too)."""

    format_penalty: float = fld(
        0.0, "reward = (1 - format_penalty) * answer score + format_penalty * format score (MMSearch-R1: 0.1)."
    )
    use_search_count_penalty: bool = fld(False, "Apply reward.search_penalty once per search (False: once).")
    search_penalty_warmup_steps: int = fld(
        0, "Ramp reward.search_penalty linearly from -search_penalty to +search_penalty over these steps."
    )


@dataclass
class MMSearchConfig:
    max_gen_round: int = fld(3, "Generation turns at most (MMSearch-R1: 3; a search in the last turn ends it).")
    image_search_limit: int = fld(1, "Image searches per trajectory; one more ends the trajectory.")
    text_search_limit: int = fld(1, "Text searches per trajectory (official script: 2); one more ends it.")
    image_min_pixels: int = fld(
        262144, "Question images are canonicalised to at least this many pixels (512*512, MMSearch-R1)."
    )
    image_max_pixels: int = fld(
        903168, "Question images are canonicalised to at most this many pixels (672*672*2, MMSearch-R1)."
    )
    reward: RewardShapingConfig = fld(RewardShapingConfig, "Its reward's own terms (format, per-search, warm-up).")
    prompts: PromptsConfig = fld(PromptsConfig, "Texts of the loop (the project's own wording by default).")
