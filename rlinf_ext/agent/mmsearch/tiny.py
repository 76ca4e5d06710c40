"""The tiny offline assets an MMSearch-R1 experiment needs (``AgentSpec.tiny_assets``): the multimodal world, and
its warm start when the rollout model is `qwen2.5-vl-tiny-sft`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlinf_ext.assets.core.tiny import Parts
from rlinf_ext.assets.mmsearch.paths import layout


def tiny_parts(cfg: Any) -> Parts:
    model = Path(str(cfg.rollout.model.model_path)).name
    return Parts.of(mm=True, mm_sft=model == layout(Path(str(cfg.paths.tiny_assets))).qwen2_5_vl_tiny_sft.name)
