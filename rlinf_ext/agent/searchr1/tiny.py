"""The tiny offline assets a Search-R1 experiment needs (``AgentSpec.tiny_assets``): the base world, the base world's
warm start when the rollout model is it (`qwen2-tiny-sft-search`), and the registry world (`assets/registry/`, the
tiny experiment's) when the rollout model is its warm start or the run reads its data or corpus."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlinf_ext.assets.core.tiny import Parts
from rlinf_ext.assets.registry.generate import READER_MODEL, REGISTRY_DIR
from rlinf_ext.assets.searchr1.sft import SEARCH_DIR


def tiny_parts(cfg: Any) -> Parts:
    model = Path(str(cfg.rollout.model.model_path))
    registry = Path(str(cfg.paths.tiny_assets)) / REGISTRY_DIR
    data = getattr(cfg, "data", None)
    read = [
        *(getattr(data, "train_data_paths", None) or []),
        *(getattr(data, "val_data_paths", None) or []),
        getattr(getattr(cfg, "retrieval", None), "corpus_path", None),
    ]
    reads_registry = any(p and Path(str(p)).is_relative_to(registry) for p in read)
    return Parts.of(sft_search=model.name == SEARCH_DIR, registry=model.name == READER_MODEL or reads_registry)
