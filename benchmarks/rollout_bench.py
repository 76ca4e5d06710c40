#!/usr/bin/env python
"""Rollout benchmark: engine stop strings vs generate-then-cut (RLinf's way), and search latency per call.

Runs the Search-R1 agent loop with the tiny Qwen2 model (transformers, CPU) against a real retrieval server
(BM25 over the tiny corpus, started on loopback) in two modes:
  engine-stop        the engine stops at `</search>` / `</answer>` / EOS (this project);
  generate-then-cut  the engine runs to EOS / max_new_tokens, the text is cut after the first stop string and
                     re-encoded (RLinf 0.3's SGLang/vLLM path).
and prints generated vs kept tokens per turn, time per mode, how often re-encoding changed the ids, and the
search client's latency per call.

The tiny model is random; `ForcedActions` makes it search for a corpus title and then answer (the tokens it
samples after a closing tag are free, as a real model's would be). Use --model for a trained checkpoint and
--no-force to let it act on its own.

    python benchmarks/rollout_bench.py [--prompts 8 --group-size 4 --max-new-tokens 200 --max-turns 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlinf_ext.agent.core.config import AgentLoopConfig
from rlinf_ext.agent.searchr1.loop import run_group
from rlinf_ext.agent.searchr1.protocol import SEARCHR1_STOPS
from rlinf_ext.agent.core.scripted import ForcedActions
from rlinf_ext.generation.hf import HFGenerator
from rlinf_ext.protocol.generation import GenerationResult, SamplingParams
from rlinf_ext.tools import SearchTool, SearchToolConfig, close_http_session


@dataclass
class CutStats:
    turns: int = 0
    reencode_changed: int = 0


class GenerateThenCut:
    """RLinf's way: no stop strings in the engine; cut the text after the first stop, re-encode it."""

    def __init__(self, inner: HFGenerator, stats: CutStats):
        self.inner, self.stats = inner, stats

    async def generate(self, prompt_ids, sampling_params: SamplingParams) -> GenerationResult:
        stops = list(sampling_params.stop)
        raw = await self.inner.generate(prompt_ids, sampling_params.with_updates(stop=[]))
        tokenizer = self.inner.tokenizer
        text = raw.text
        cuts = [(text.find(s) + len(s), s) for s in stops if s in text]
        self.stats.turns += 1
        if not cuts:
            return GenerationResult(raw.output_ids, text, raw.finish_reason, None, raw.logprobs,
                                    num_generated=len(raw.output_ids))
        end, matched = min(cuts)
        kept_text = text[:end]
        ids = tokenizer.encode(kept_text, add_special_tokens=False)
        if ids != raw.output_ids[: len(ids)]:
            self.stats.reencode_changed += 1
        return GenerationResult(ids, kept_text, "stop", matched, None, num_generated=len(raw.output_ids))


@dataclass
class ModeResult:
    name: str
    seconds: float
    trajectories: list = field(default_factory=list)
    cut: CutStats | None = None


def per_turn_table(result: ModeResult) -> list[tuple[int, int, float, float]]:
    """(turn index, n, mean generated, mean kept) per turn position."""
    rows = []
    depth = max(len(t.turns) for t in result.trajectories)
    for k in range(depth):
        generated, kept = [], []
        for traj in result.trajectories:
            if k < len(traj.turns):
                turn = traj.turns[k]
                generated.append(turn.generated_tokens)
                kept.append(len(turn.response_ids))
        rows.append((k + 1, len(kept), statistics.mean(g for g in generated), statistics.mean(kept)))
    return rows


async def run_mode(name, generator, tokenizer, prompts, titles, agent_cfg, search_cfg, params, group_size):
    tool = SearchTool(search_cfg, seed=0)
    started = time.perf_counter()
    try:
        groups = await asyncio.gather(*(
            run_group(generator, tokenizer, p, [t], agent_cfg, tool, group_size, sampling_params=params)
            for p, t in zip(prompts, titles)
        ))
    finally:
        await close_http_session()
    result = ModeResult(name, time.perf_counter() - started, [t for g in groups for t in g])
    return result, tool


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", default=None, help="tiny assets dir (generated if missing); default: a temp dir")
    parser.add_argument("--model", default=None, help="HF model dir (default: the tiny random Qwen2)")
    parser.add_argument("--no-force", action="store_true", help="do not script the actions (trained models)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=200, help="per turn")
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    from rlinf_ext.assets.core.tiny import make_tiny_assets
    from rlinf_ext.retrieval.build import build_index
    from rlinf_ext.retrieval.config import BuildConfig
    from rlinf_ext.retrieval.launch import RetrievalServerProcess

    work = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    assets = make_tiny_assets(Path(args.assets) if args.assets else work / "assets", seed=0)
    index_dir = work / "bm25"
    build_index(BuildConfig(corpus=str(assets.corpus_path), out=str(index_dir), retriever="bm25"))

    model_dir = Path(args.model) if args.model else assets.qwen2_tiny
    tokenizer_dir = model_dir if args.model else assets.tokenizer_dir
    generator = HFGenerator.from_pretrained(model_dir, tokenizer_dir, seed=0, max_batch_size=args.max_batch_size)
    tokenizer = generator.tokenizer
    rows = [json.loads(line) for line in assets.rlinf_train.read_text().splitlines()[: args.prompts]]
    docs = [json.loads(line) for line in assets.corpus_path.read_text().splitlines()[: args.prompts]]
    titles = [d["contents"].split("\n")[0].strip('"') for d in docs]
    prompts = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in rows]

    agent_cfg = AgentLoopConfig(max_turns=args.max_turns, response_length_total=4096, max_obs_length=500)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, stop=list(SEARCHR1_STOPS))

    with RetrievalServerProcess(index_dir, assets.corpus_path, startup_timeout_s=120) as url:
        search_cfg = SearchToolConfig(backend="local", server_addr=url, topk=args.topk, default_timeout=30)
        results, tools = [], []
        for name in ("engine-stop", "generate-then-cut"):
            cut = CutStats()
            gen = generator if name == "engine-stop" else GenerateThenCut(generator, cut)
            mode_results = []
            # a separate run per title so that forced queries differ per prompt
            for prompt, title in zip(prompts, titles):
                generator.logits_processors = [] if args.no_force else [ForcedActions(tokenizer, title, title)]
                generator.reseed(0)
                res, tool = asyncio.run(run_mode(name, gen, tokenizer, [prompt], [title], agent_cfg, search_cfg,
                                                 params, args.group_size))
                mode_results.append(res)
                tools.append((name, tool))
            merged = ModeResult(name, sum(r.seconds for r in mode_results),
                                [t for r in mode_results for t in r.trajectories], cut if name != "engine-stop" else None)
            results.append(merged)

    print(f"\nRollout benchmark: {args.prompts} prompts x group {args.group_size}, max_new_tokens/turn "
          f"{args.max_new_tokens}, max_turns {args.max_turns}, model {model_dir.name}"
          f"{'' if args.no_force else ' (actions forced)'}, CPU\n")
    print(f"{'mode':<18} {'turn':>4} {'n':>4} {'generated':>10} {'kept':>8} {'wasted':>8}")
    summary = {}
    for result in results:
        for turn, n, gen_mean, kept_mean in per_turn_table(result):
            waste = 1 - kept_mean / gen_mean if gen_mean else 0.0
            print(f"{result.name:<18} {turn:>4} {n:>4} {gen_mean:>10.1f} {kept_mean:>8.1f} {waste:>7.0%}")
        generated = sum(t.metrics["generated_tokens"] for t in result.trajectories)
        kept = sum(t.metrics["kept_tokens"] for t in result.trajectories)
        summary[result.name] = {
            "seconds": round(result.seconds, 2), "generated_tokens": generated, "kept_tokens": kept,
            "generated_per_s": round(generated / result.seconds, 1),
            "reencode_changed_turns": None if result.cut is None else result.cut.reencode_changed,
            "cut_turns": None if result.cut is None else result.cut.turns,
        }
    print()
    print(f"{'mode':<18} {'time s':>8} {'generated':>10} {'kept':>8} {'kept/generated':>15} {'re-encode changed ids':>22}")
    for name, s in summary.items():
        changed = "-" if s["cut_turns"] is None else f"{s['reencode_changed_turns']}/{s['cut_turns']} turns"
        print(f"{name:<18} {s['seconds']:>8.2f} {s['generated_tokens']:>10.0f} {s['kept_tokens']:>8.0f} "
              f"{s['kept_tokens'] / s['generated_tokens']:>15.2f} {changed:>22}")

    latencies = [lat * 1000 for _, tool in tools for lat in tool.stats.latencies_s]
    failures = sum(tool.stats.failures for _, tool in tools)
    q = statistics.quantiles(latencies, n=20) if len(latencies) > 1 else latencies * 19
    print(f"\nsearch latency per call (client side, HTTP to BM25 server on loopback, topk {args.topk}): "
          f"n={len(latencies)} mean {statistics.mean(latencies):.1f} ms, p50 {statistics.median(latencies):.1f} ms, "
          f"p95 {q[18]:.1f} ms, max {max(latencies):.1f} ms, failures {failures}")
    summary["search_latency_ms"] = {"n": len(latencies), "mean": statistics.mean(latencies),
                                    "p50": statistics.median(latencies), "p95": q[18], "max": max(latencies)}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
