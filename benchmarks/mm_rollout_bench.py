#!/usr/bin/env python
"""MMSearch-R1 rollout benchmark on CPU: the tiny Qwen2.5-VL through the real loop, image cache and BM25 server.

Runs `--questions` test questions of the tiny multimodal world x `--group-size` sampled trajectories with the
CPU vision-language engine (one torch thread by default, as the workers run) and prints seconds per turn and
per trajectory, the engine's own call latency, tokens generated vs kept per turn index (the engine stops at
`</search>` / `</text_search>` / `</answer>` / EOS, so the ratio is 1.00: nothing is generated past a stop
and cut afterwards), searches made, and image-preprocessing cache hits.

    python benchmarks/mm_rollout_bench.py [--questions 12 --group-size 4 --max-new-tokens 48 --threads 1]
    python benchmarks/mm_rollout_bench.py --random      # the random tiny model (no warm start needed)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


class TimedGenerator:
    """Records the wall time of every engine call (a call serves one row; rows are batched inside)."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, []

    async def generate(self, prompt_ids, sampling_params, images=None):
        started = time.perf_counter()
        result = await self.inner.generate(prompt_ids, sampling_params, images=images)
        self.seconds.append(time.perf_counter() - started)
        return result


async def run_all(generator, processor, tools, tasks, settings, params, group_size):
    from rlinf_ext.agent.mmsearch.loop import run_group
    from rlinf_ext.tools import close_http_session

    try:
        groups = await asyncio.gather(
            *(run_group(generator, processor, tools, t, settings, group_size, sampling_params=params) for t in tasks)
        )
    finally:
        await close_http_session()
    return [traj for g in groups for traj in g]


def per_turn(trajectories) -> list[tuple[int, int, float, float]]:
    by_turn = defaultdict(list)
    for t in trajectories:
        for k, turn in enumerate(t.turns):
            by_turn[k].append((turn.generated_tokens or len(turn.response_ids), len(turn.response_ids)))
    return [
        (k, len(v), statistics.mean(g for g, _ in v), statistics.mean(kept for _, kept in v))
        for k, v in sorted(by_turn.items())
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", default=None, help="tiny assets dir (generated if missing); default: a temp dir")
    parser.add_argument("--random", action="store_true", help="the random tiny VL model instead of the warm start")
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48, help="per turn")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    from rlinf_ext.agent.mmsearch.loop import LoopSettings, SearchTools
    from rlinf_ext.agent.mmsearch.types import Task
    from rlinf_ext.assets.core.tiny import make_tiny_assets
    from rlinf_ext.config.schema import ImageSearchToolConfig
    from rlinf_ext.data.fvqa import read_fvqa
    from rlinf_ext.generation.hf_vl import HFVLGenerator
    from rlinf_ext.protocol.generation import SamplingParams
    from rlinf_ext.retrieval.build import build_index
    from rlinf_ext.retrieval.config import BuildConfig
    from rlinf_ext.retrieval.launch import RetrievalServerProcess
    from rlinf_ext.tools import SearchTool
    from rlinf_ext.tools.config import SearchToolConfig
    from rlinf_ext.tools.image_search import ImageSearch

    work = Path(tempfile.mkdtemp(prefix="mm-rollout-bench-"))
    assets = make_tiny_assets(
        Path(args.assets) if args.assets else work / "assets",
        seed=0,
        with_mm=True,
        with_mm_sft=not args.random,
        verbose=True,
    )
    mm = assets.mm
    index_dir = work / "bm25"
    build_index(BuildConfig(corpus=str(assets.corpus_path), out=str(index_dir), retriever="bm25"))
    model_dir = mm.qwen2_5_vl_tiny if args.random else mm.qwen2_5_vl_tiny_sft
    engine = HFVLGenerator.from_pretrained(
        model_dir, num_threads=args.threads, seed=0, max_batch_size=args.max_batch_size
    )
    generator = TimedGenerator(engine)
    px = 56 * 56
    tasks = [Task.from_row(r) for r in read_fvqa(mm.fvqa_test, px, px, limit=args.questions)]
    settings = LoopSettings(
        max_gen_round=3, image_search_limit=1, text_search_limit=1, response_length_total=1280, max_obs_length=320
    )
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, stop=[])
    image_tool = ImageSearch(
        ImageSearchToolConfig(
            backend="cache_dir", cache_path=str(mm.cache_test), topk=3, thumbnail_min_pixels=px, thumbnail_max_pixels=px
        )
    )
    with RetrievalServerProcess(index_dir, assets.corpus_path, startup_timeout_s=120) as url:
        text_tool = SearchTool(SearchToolConfig(backend="local", server_addr=url, topk=3, default_timeout=30))
        started = time.perf_counter()
        trajs = asyncio.run(
            run_all(
                generator,
                engine.processor,
                SearchTools(image_tool, text_tool),
                tasks,
                settings,
                params,
                args.group_size,
            )
        )
        wall = time.perf_counter() - started

    turns = sum(len(t.turns) for t in trajs)
    generated = sum(t.metrics["generated_tokens"] for t in trajs)
    kept = sum(t.metrics["kept_tokens"] for t in trajs)
    print(
        f"\nMM rollout benchmark: {len(tasks)} questions x group {args.group_size} = {len(trajs)} trajectories, "
        f"model {model_dir.name}, max_new_tokens/turn {args.max_new_tokens}, torch threads {args.threads}, CPU\n"
    )
    print(f"{'turn':>4} {'n':>4} {'generated':>10} {'kept':>8}")
    for k, n, g, kp in per_turn(trajs):
        print(f"{k + 1:>4} {n:>4} {g:>10.1f} {kp:>8.1f}")
    calls = sorted(generator.seconds)
    summary = {
        "trajectories": len(trajs),
        "turns": turns,
        "wall_s": round(wall, 2),
        "s_per_turn": round(wall / turns, 3),
        "s_per_trajectory": round(wall / len(trajs), 3),
        "engine_call_s_median": round(statistics.median(calls), 3),
        "engine_batches": len(engine.batch_sizes),
        "mean_batch_size": round(statistics.mean(engine.batch_sizes), 2),
        "generated_tokens": generated,
        "kept_tokens": kept,
        "kept_over_generated": round(kept / generated, 3),
        "image_searches": sum(t.metrics["image_searches"] for t in trajs),
        "text_searches": sum(t.metrics["text_searches"] for t in trajs),
        "image_cache_hits": engine.images.hits,
        "image_cache_misses": engine.images.misses,
        "end_reasons": dict(
            sorted({r: sum(t.end_reason == r for t in trajs) for r in {t.end_reason for t in trajs}}.items())
        ),
    }
    print(
        f"\nwall {wall:.2f} s: {summary['s_per_turn']:.3f} s per turn, {summary['s_per_trajectory']:.3f} s per "
        f"trajectory ({turns} turns); engine call median {summary['engine_call_s_median']:.3f} s over "
        f"{len(calls)} calls in {summary['engine_batches']} batches (mean batch {summary['mean_batch_size']})"
    )
    print(f"tokens generated {generated:.0f}, kept {kept:.0f}: kept/generated {summary['kept_over_generated']:.2f}")
    print(
        f"searches: image {summary['image_searches']:.0f}, text {summary['text_searches']:.0f}; image preprocessing "
        f"cache hits {engine.images.hits} / misses {engine.images.misses}; end reasons {summary['end_reasons']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
