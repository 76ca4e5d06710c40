"""Where the tiny multimodal world lives under an assets root (light: no torch, no PIL)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MM_GENERATOR_VERSION = 5  # 5: the emblem world (colour-word titles, true emblem at a random rank, 20 held-out cities)
# the control runs' image-search caches beside each split's own (benchmarks/learning_bench.py)
ABLATED, TITLES_PERMUTED = "ablated", "titles_permuted"
CONTROLS = (ABLATED, TITLES_PERMUTED)


@dataclass(frozen=True)
class Assets:
    root: Path  # <assets>/mm
    emblems: Path  # emblems.json
    fvqa_train: Path
    fvqa_test: Path
    train_paths: Path  # jsonl: data_id -> kind, city, text query (the scripted path of the warm start)
    test_paths: Path
    cache_train: Path  # FVQA_Cache layout
    cache_test: Path
    cache_test_pickle: Path  # official layout, PIL images pickled by the installed Pillow
    processor_dir: Path  # VL tokenizer + processor
    qwen2_5_vl_tiny: Path  # random (H64)
    qwen2_5_vl_tiny_sft: Path  # warm-started (H128); only with_mm_sft

    def control_cache(self, split: str, control: str) -> Path:
        """A control's cache of ``split`` (train | test): `ablated` (nothing usable: no result is the true emblem or
        has its colour) or `titles_permuted` (the cities of the titles shuffled among the thumbnails)."""
        if control not in CONTROLS:
            raise ValueError(f"no control cache {control!r}; known: {CONTROLS}")
        base = {"train": self.cache_train, "test": self.cache_test}[split]
        return base.with_name(f"{base.name}_{control}")


def layout(root: Path) -> Assets:
    mm = root / "mm"
    return Assets(
        root=mm,
        emblems=mm / "emblems.json",
        fvqa_train=mm / "data" / "train.parquet",
        fvqa_test=mm / "data" / "test.parquet",
        train_paths=mm / "data" / "train_paths.jsonl",
        test_paths=mm / "data" / "test_paths.jsonl",
        cache_train=mm / "image_search" / "tinymm_train_cache",
        cache_test=mm / "image_search" / "tinymm_test_cache",
        cache_test_pickle=mm / "image_search" / "tinymm_test_image_search_results_cache.pkl",
        processor_dir=mm / "processor",
        qwen2_5_vl_tiny=mm / "models" / "qwen2.5-vl-tiny",
        qwen2_5_vl_tiny_sft=mm / "models" / "qwen2.5-vl-tiny-sft",
    )
