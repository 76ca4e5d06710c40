"""The tiny offline assets a Search-R1 experiment needs (``AgentSpec.tiny_assets``): the text world, and the warm
start its rollout model names (the search phase for `qwen2-tiny-sft-search`, both phases for `qwen2-tiny-sft`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlinf_ext.assets.core.tiny import Parts
from rlinf_ext.assets.searchr1.sft import GIVE_UP_DIR, SEARCH_DIR


def tiny_parts(cfg: Any) -> Parts:
    model = Path(str(cfg.rollout.model.model_path)).name
    return Parts.of(sft_search=model == SEARCH_DIR, sft=model == GIVE_UP_DIR)
