"""`rlinf-ext make-tiny-assets [--out DIR] [--seed N] [--with-sft-search] [--with-registry] [--with-mm [--with-mm-sft]]`.

Without ``--out`` the assets go into the cache (`assets/core/cache.py`), built only when missing, and the entry's
path is printed: the step CI runs before the tests, and what the tests and the tiny experiments copy from.
With ``--out DIR`` they are generated into DIR (reused if its MANIFEST matches, this code's cache key included),
without the cache, and the command prints the launch line that runs on DIR as it is (``paths.tiny_assets=DIR``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Generate into this directory (reused if its MANIFEST.json matches) instead of the cache "
        "($RLINF_EXT_ASSET_CACHE, else ~/.cache/rlinf_ext/tiny_assets; docs/environment.md).",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="Seed of the invented world, the data splits and the model weights."
    )
    parser.add_argument(
        "--with-sft-search",
        action="store_true",
        help="Also train models/qwen2-tiny-sft-search, the base world's warm start (always searches; "
        "what the end-to-end tests start from; ~5 min on 2 cores).",
    )
    parser.add_argument(
        "--with-registry",
        action="store_true",
        help="Also build the registry world under registry/ (the tiny experiment's world: one-token "
        "names, held-out subjects) and train its reader warm start, checked by its gate on the "
        "held-out questions (~4 min on 2 cores; the figures go into MANIFEST.json).",
    )
    parser.add_argument(
        "--with-mm",
        action="store_true",
        help="Also build the multimodal world of MMSearch-R1 (emblems, FVQA parquet, image-search "
        "caches, VL tokenizer/processor, tiny Qwen2.5-VL) under mm/.",
    )
    parser.add_argument(
        "--with-mm-sft",
        action="store_true",
        help="With --with-mm: also train mm/models/qwen2.5-vl-tiny-sft, the warm-started tiny VL model "
        "that follows the MMSearch-R1 protocol and over-searches (a few minutes on CPU).",
    )
    parser.add_argument(
        "--eval-sft",
        action="store_true",
        help="With --with-sft-search, print that warm start's greedy EM per test file (gold observation "
        "/ no observation / live BM25 loop). The registry warm start's probes are in its manifest "
        "entry and printed with the summary.",
    )


def _summary(assets) -> str:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.assets.core.formats import read_jsonl

    manifest = json.loads(assets.manifest_path.read_text())
    size = sum((assets.root / rel).stat().st_size for rel in manifest["files"])
    lines = [
        f"tiny assets (seed {assets.seed}, generator v{manifest['version']}) in {assets.root}:",
        f"  corpus      {assets.corpus_path}  ({len(read_jsonl(assets.corpus_path))} passages)",
        f"  pages       {assets.pages_path}",
        f"  train       {assets.searchr1_train}  /  {assets.rlinf_train}  ({len(read_jsonl(assets.rlinf_train))} questions)",
    ]
    for b in assets.benchmarks:
        lines.append(f"  test {b:<16} {len(read_jsonl(assets.rlinf_test[b]))} questions")
    lines += [
        f"  tokenizer   {assets.tokenizer_dir}",
        f"  models      {assets.qwen2_tiny}, {assets.qwen2_tiny_untied.name}, {assets.bert_encoder.name}"
        + (f", {assets.qwen2_tiny_sft_search.name}" if assets.qwen2_tiny_sft_search else ""),
        *(_registry_lines(assets, manifest) if assets.registry else []),
        *(
            [
                f"  mm          {assets.mm.fvqa_train.parent} (FVQA), {assets.mm.cache_train.parent} (image search), "
                f"{assets.mm.qwen2_5_vl_tiny}"
            ]
            if assets.mm
            else []
        ),
        *(_mm_sft_lines(manifest) if "mm_sft" in manifest else []),
        f"  {len(manifest['files'])} files, {size / 1e6:.1f} MB; stage seconds: {manifest.get('timings_s', {})}",
    ]
    return "\n".join(lines)


def _registry_lines(assets, manifest: dict) -> list[str]:
    entry = manifest.get("registry", {})
    gate = ", ".join(f"{k} {v:.3f}" for k, v in entry.get("warm_start_gate", {}).items())
    return [
        f"  registry    {assets.registry.root} (corpus, train/held-out questions, {assets.registry.model.name})",
        f"              held-out facts in warm-start targets: {entry.get('heldout_fact_overlap')}; held-out "
        f"page top-1 for the query: {entry.get('retrieval_top1_query')}",
        f"              warm-start gate on held-out questions ({'passed' if entry.get('warm_start_gate_passed') else 'MISSED'}): {gate}",
    ]


def _mm_sft_lines(manifest: dict) -> list[str]:
    entry = manifest["mm_sft"]
    gate = ", ".join(f"{k} {v:.3f}" for k, v in entry["warm_start_gate"].items())
    return [
        f"  mm sft      held-out emblems in reading examples: {entry['heldout_emblem_overlap']}; warm-start gate "
        f"on held-out questions ({'passed' if entry['warm_start_gate_passed'] else 'MISSED'}): {gate}"
    ]


# the tiny experiments and the parts their rollout model and data need (AgentSpec.tiny_assets of their agents)
TINY_EXPERIMENTS = (("tiny-cpu", "registry"), ("tiny-mm-cpu", "mm_sft"))


def launch_lines(root: Path, seed: int) -> list[str]:
    """How to run on a directory made with ``--out``: the launcher uses it as it is (no copy from the cache), or
    refuses it naming what it lacks (`runner/prepare.py`)."""
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.assets.core.tiny import Parts, read_manifest

    if seed != 0:
        return [f"the tiny experiments run on seed 0: {root} (seed {seed}) serves your own scripts only"]
    have = Parts.of_manifest(read_manifest(root))
    lines = [f"the launcher uses {root} as it is (or says what it lacks); run on it with:"]
    for name, part in TINY_EXPERIMENTS:
        line = f"  rlinf-ext train {name} paths.tiny_assets={root}"
        if not have.has(part):  # the launcher would refuse it: say how to add the part first
            line += f"   (first: rlinf-ext make-tiny-assets --out {root}{have.union(Parts.of(**{part: True})).flags()})"
        lines.append(line)
    return lines


def run(verb: str, args: argparse.Namespace) -> int:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.assets.core.tiny import Parts, make_tiny_assets

    if args.eval_sft and not args.with_sft_search:
        print("rlinf-ext make-tiny-assets: --eval-sft needs --with-sft-search (the model it evaluates).")
        return 2
    t0 = time.perf_counter()
    parts = Parts.of(
        sft_search=args.with_sft_search, registry=args.with_registry, mm=args.with_mm, mm_sft=args.with_mm_sft
    )
    if args.out is not None:
        # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
        from rlinf_ext.assets.core.cache import cache_key

        assets = make_tiny_assets(args.out, seed=args.seed, parts=parts, verbose=True, code_key=cache_key())
    else:
        # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
        from rlinf_ext.assets.core.cache import CACHE_ENV, cache_dir, cached_tiny_assets

        print(f"[assets] cache: {cache_dir()} (${CACHE_ENV} moves it)", flush=True)
        assets = cached_tiny_assets(parts, seed=args.seed)
    print(_summary(assets))
    print(f"done in {time.perf_counter() - t0:.1f}s: {assets.root} ({parts.describe()})")
    if args.out is not None:
        print("\n".join(launch_lines(assets.root, args.seed)))
    if args.eval_sft:
        # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
        from rlinf_ext.assets.searchr1.sft_eval import evaluate_assets, format_table

        print(f"warm start {assets.qwen2_tiny_sft_search}:")
        print(format_table(evaluate_assets(assets)))
    return 0
