"""`rlinf-ext make-tiny-assets [--out DIR] [--seed N] [--with-sft-search | --with-sft] [--with-mm [--with-mm-sft]]`.

Without ``--out`` the assets go into the cache (`assets/core/cache.py`), built only when missing, and the entry's
path is printed: the step CI runs before the tests, and what the tests and the tiny experiments copy from.
With ``--out DIR`` they are generated into DIR (reused if its MANIFEST matches), without the cache."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None,
                        help="Generate into this directory (reused if its MANIFEST.json matches) instead of the cache "
                             "($RLINF_EXT_ASSET_CACHE, else ~/.cache/rlinf_ext/tiny_assets; docs/environment.md).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the invented world, the data splits and the model weights.")
    parser.add_argument("--with-sft-search", action="store_true",
                        help="Also train models/qwen2-tiny-sft-search, the warm start's search phase (always searches; "
                             "what the end-to-end tests start from; ~5 min on 2 cores).")
    parser.add_argument("--with-sft", action="store_true",
                        help="Also train models/qwen2-tiny-sft, the warm-started model of the tiny experiment: the "
                             "search phase, then a short give-up phase (~1-2 min more).")
    parser.add_argument("--with-mm", action="store_true",
                        help="Also build the multimodal world of MMSearch-R1 (emblems, FVQA parquet, image-search "
                             "caches, VL tokenizer/processor, tiny Qwen2.5-VL) under mm/.")
    parser.add_argument("--with-mm-sft", action="store_true",
                        help="With --with-mm: also train mm/models/qwen2.5-vl-tiny-sft, the warm-started tiny VL model "
                             "that follows the MMSearch-R1 protocol and over-searches (a few minutes on CPU).")
    parser.add_argument("--eval-sft", action="store_true",
                        help="After --with-sft, print the warm-started model's (and the search-only SFT's) greedy EM per test file "
                             "(gold observation / no observation / live BM25 loop).")


def _summary(assets) -> str:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.assets.core.formats import read_jsonl

    manifest = json.loads(assets.manifest_path.read_text())
    size = sum((assets.root / rel).stat().st_size for rel in manifest["files"])
    lines = [f"tiny assets (seed {assets.seed}, generator v{manifest['version']}) in {assets.root}:",
             f"  corpus      {assets.corpus_path}  ({len(read_jsonl(assets.corpus_path))} passages)",
             f"  pages       {assets.pages_path}",
             f"  train       {assets.searchr1_train}  /  {assets.rlinf_train}  ({len(read_jsonl(assets.rlinf_train))} questions)"]
    for b in assets.benchmarks:
        lines.append(f"  test {b:<16} {len(read_jsonl(assets.rlinf_test[b]))} questions")
    lines += [f"  tokenizer   {assets.tokenizer_dir}",
              f"  models      {assets.qwen2_tiny}, {assets.qwen2_tiny_untied.name}, {assets.bert_encoder.name}"
              + "".join(f", {m.name}" for m in (assets.qwen2_tiny_sft_search, assets.qwen2_tiny_sft) if m),
              *([f"  mm          {assets.mm.fvqa_train.parent} (FVQA), {assets.mm.cache_train.parent} (image search), "
                 f"{assets.mm.qwen2_5_vl_tiny}"] if assets.mm else []),
              f"  {len(manifest['files'])} files, {size / 1e6:.1f} MB; stage seconds: {manifest.get('timings_s', {})}"]
    return "\n".join(lines)


def run(verb: str, args: argparse.Namespace) -> int:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.assets.core.tiny import Parts, make_tiny_assets

    if args.eval_sft and not args.with_sft:
        print("rlinf-ext make-tiny-assets: --eval-sft needs --with-sft (the model it evaluates).")
        return 2
    t0 = time.perf_counter()
    parts = Parts.of(sft_search=args.with_sft_search, sft=args.with_sft, mm=args.with_mm, mm_sft=args.with_mm_sft)
    if args.out is not None:
        assets = make_tiny_assets(args.out, seed=args.seed, parts=parts, verbose=True)
    else:
        # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
        from rlinf_ext.assets.core.cache import CACHE_ENV, cache_dir, cached_tiny_assets

        print(f"[assets] cache: {cache_dir()} (${CACHE_ENV} moves it)", flush=True)
        assets = cached_tiny_assets(parts, seed=args.seed)
    print(_summary(assets))
    print(f"done in {time.perf_counter() - t0:.1f}s: {assets.root} ({parts.describe()})")
    if args.eval_sft:
        # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
        from rlinf_ext.assets.searchr1.sft_eval import evaluate_assets, format_table

        print(f"warm start ({assets.qwen2_tiny_sft}; gives up without searching on most questions):")
        print(format_table(evaluate_assets(assets)))
        print(f"search-only SFT before the give-up pass ({assets.qwen2_tiny_sft_search}):")
        print(format_table(evaluate_assets(assets, model_dir=assets.qwen2_tiny_sft_search)))
    return 0
