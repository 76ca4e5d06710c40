#!/usr/bin/env python
"""Rollout benchmark: the Search-R1 agent rollout on vLLM vs the HF engine (tokens/s), or engine stop strings vs
generate-then-cut on the HF engine.

--mode engines (default): the same agent rollout (same prompts, stop strings, concurrency, sampling, seeds) on
each engine of --engines, on a random-weight Qwen2 of --shape ("tiny": 2 layers, hidden 128, head size 32, the
tiny tokenizer's vocabulary; "0.5b": Qwen2.5-0.5B's dimensions and 151936-entry vocabulary), same dtype on both.
Every engine runs in its own fresh process (vLLM's CPU platform binds threads; neither engine inherits the other's
state); the start-up is timed apart, a short warm-up call precedes the timed rollout. Printed: tokens/s and tokens
per CPU-second of the engine's process (on a shared, oversubscribed CPU the wall time depends on the other load
while each engine runs; the CPU time much less), each with the ratio to the last engine, and where each engine's
time goes (vLLM: scheduler, forward, sampler, scheduler update, output processing, and the rest = our async
wrapper, the agent loop and tokenisation; HF: time inside `generate`).

Fairness: random weights would end turns at random places (EOS, a stop string) and differently on each engine.
The benchmark's checkpoint makes that impossible without touching an engine: the tied embedding rows of the EOS
ids, the four action tags and every id the tokenizer does not know are zero (their logit is exactly 0) while the
final norm scales the other logits to a standard deviation of 8, so they are never sampled (probability < e^-30 per
step). Each turn therefore runs to --max-new-tokens on both engines, ends "length", is an invalid action, gets the
invalid-action observation, and the next turn follows: every engine generates prompts x group x turns x
max_new_tokens tokens (checked and printed). The model never searches, so no retrieval runs in this mode. Sampling
is temperature 1 with seeds base 0 + call index on both engines (HF: per batch, vLLM: per request).

--mode stop-vs-cut (HF engine): the tiny Qwen2 of the tiny assets with `ForcedActions` (search for a corpus title,
then answer) against a real BM25 retrieval server on loopback, in two ways:
  engine-stop        the engine stops at `</search>` / `</answer>` / EOS (this project);
  generate-then-cut  the engine runs to EOS / max_new_tokens, the text is cut after the first stop string and
                     re-encoded (RLinf 0.3's SGLang/vLLM path);
printing generated vs kept tokens per turn, how often re-encoding changed the ids, and the search latency per call.

The tiny assets (prompts, tokenizer) are built in a child process: they build a BM25 index, and `import bm25s`
loads llvmlite, beside which an in-process vLLM engine cannot start on CPU.

    python benchmarks/rollout_bench.py --engines vllm,hf --shape tiny --prompts 8 --group-size 4 --max-new-tokens 256
    python benchmarks/rollout_bench.py --shape 0.5b --prompts 4 --group-size 4 --max-new-tokens 64 --json out.json
    python benchmarks/rollout_bench.py --mode stop-vs-cut [--prompts 8 --group-size 4 --max-new-tokens 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import queue
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINES = ("vllm", "hf")
DTYPES = ("float32", "bfloat16")
# "tiny": the issue's 2-layer hidden-128 model with head size 32 (vLLM's CPU attention refuses the assets' 16);
# its vocabulary is the tokenizer's, padded. "0.5b": random_qwen2's shape as it is.
TINY_SHAPE = dict(
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
SHAPES = ("tiny", "0.5b")
LOGIT_STD = 8.0  # of the reachable tokens' logits; an unreachable id's logit is 0
ACTION_TAGS = ("<search>", "</search>", "<answer>", "</answer>")
INIT_STD = 0.02  # transformers' initializer_range, the embedding's init std


# ------------------------------------------------------------------------------------------------ pure helpers
def unreachable_ids(eos_ids: set[int], tag_ids: list[int], tokenizer_len: int, vocab_size: int) -> list[int]:
    """Ids the benchmark's model must never sample: EOS, the action tags, and every id past the tokenizer."""
    return sorted(set(eos_ids) | set(tag_ids) | set(range(tokenizer_len, vocab_size)))


def final_norm_scale(hidden_size: int, logit_std: float = LOGIT_STD, init_std: float = INIT_STD) -> float:
    """The final RMSNorm weight that gives logits of std ``logit_std``: the normed state has unit RMS and a
    random embedding row has entries of std ``init_std``, so a logit has std ``scale * init_std * sqrt(H)``."""
    return logit_std / (init_std * hidden_size**0.5)


def ratio_rows(results: dict[str, dict], baseline: str, key: str = "tokens_per_s") -> list[tuple[str, float, float]]:
    """(engine, figure ``key``, ratio to ``baseline``'s) per engine, in the given order."""
    base = results[baseline][key]
    return [(name, r[key], r[key] / base if base else float("nan")) for name, r in results.items()]


def format_engine_table(results: dict[str, dict], baseline: str) -> str:
    lines = [
        f"{'engine':<6} {'start s':>8} {'rollout s':>10} {'tokens':>8} {'turns':>6} {'tokens/s':>10} "
        f"{'vs ' + baseline:>8} {'CPU s':>8} {'tokens/CPU-s':>13} {'vs ' + baseline:>8}"
    ]
    per_cpu = {name: (value, ratio) for name, value, ratio in ratio_rows(results, baseline, "tokens_per_cpu_s")}
    for name, tps, ratio in ratio_rows(results, baseline):
        r = results[name]
        lines.append(
            f"{name:<6} {r['start_s']:>8.2f} {r['seconds']:>10.2f} {r['generated_tokens']:>8d} "
            f"{r['turns']:>6d} {tps:>10.1f} {ratio:>7.2f}x {r['cpu_s']:>8.2f} {per_cpu[name][0]:>13.1f} "
            f"{per_cpu[name][1]:>7.2f}x"
        )
    return "\n".join(lines)


def format_breakdown(name: str, result: dict) -> str:
    """Where one engine's rollout time went (seconds and share of the rollout's wall time)."""
    wall = result["seconds"]
    parts = result["time_s"]
    inside = sum(parts.values())
    cells = [f"{k} {v:.2f} s ({v / wall:.0%})" for k, v in parts.items()]
    cells.append(f"rest {wall - inside:.2f} s ({(wall - inside) / wall:.0%})")
    return f"{name:<6} " + ", ".join(cells)


# ------------------------------------------------------------------------------------------------ set-up (children)
def run_in_child(fn, *args) -> Any:
    """``fn(*args)`` in a fresh spawned process (neither bm25s nor vLLM's process-wide changes, such as its
    replacement of ``torch.set_num_threads``, reach the other engine)."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_child, args=(results, fn, args))  # not a pool: its daemonic workers may not fork
    proc.start()
    try:
        while True:
            try:
                ok, value = results.get(timeout=5)
                break
            except queue.Empty:
                if not proc.is_alive():  # killed (out of memory, a signal) before it could answer
                    raise RuntimeError(f"{fn.__name__}: its child process died with exit code {proc.exitcode}")
    finally:
        proc.join()
    if not ok:
        raise RuntimeError(f"{fn.__name__} failed in its child process:\n{value}")
    return value


def _child(results, fn, args) -> None:
    import traceback

    try:
        results.put((True, fn(*args)))
    except BaseException:
        results.put((False, traceback.format_exc()))


def prepare_assets(root: str) -> tuple[str, str, str, str]:
    """The tiny assets (child process: their BM25 index imports bm25s): tokenizer dir, RLinf train rows, corpus,
    tiny model dir."""
    from rlinf_ext.assets.core.tiny import make_tiny_assets

    a = make_tiny_assets(Path(root), seed=0)
    return str(a.tokenizer_dir), str(a.rlinf_train), str(a.corpus_path), str(a.qwen2_tiny)


def build_bench_model(out_dir: str, shape: str, tokenizer_dir: str, dtype: str) -> str:
    """A random Qwen2 of ``shape`` whose unreachable ids (``unreachable_ids``) are never sampled (module doc),
    with the tiny tokenizer and its generation config; reused when already built."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from rlinf_ext.assets.core.models import generation_config, padded_vocab_size
    from rlinf_ext.assets.core.random_qwen2 import shape_config, write_random_qwen2
    from rlinf_ext.generation.hf import eos_token_ids

    out = Path(out_dir)
    done = out / "rollout_bench.done"
    if done.exists():
        return str(out)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    fields = (
        shape_config(TINY_SHAPE, vocab_size=padded_vocab_size(len(tok))) if shape == "tiny" else shape_config(shape)
    )
    if not fields["tie_word_embeddings"]:
        raise ValueError(f"shape {shape!r}: the benchmark's construction needs tied embeddings")
    write_random_qwen2(out, fields, seed=0, dtype=dtype)
    gen_cfg = generation_config(tok)
    eos = eos_token_ids(gen_cfg, tok)
    banned = unreachable_ids(eos, tok.convert_tokens_to_ids(list(ACTION_TAGS)), len(tok), fields["vocab_size"])
    (weights,) = out.glob("*.safetensors")
    state = load_file(str(weights))
    emb = "model.embed_tokens.weight"
    state[emb][banned] = 0
    state["model.norm.weight"].fill_(final_norm_scale(fields["hidden_size"]))
    state.pop("lm_head.weight", None)  # tied: the embedding is the head
    save_file(state, str(weights), metadata={"format": "pt"})
    tok.save_pretrained(str(out))
    gen_cfg.save_pretrained(str(out))
    done.write_text(json.dumps({"shape": shape, "unreachable": len(banned), "torch": torch.__version__}))
    return str(out)


# ------------------------------------------------------------------------------------------------ one engine (child)
@dataclass
class Timers:
    """Seconds spent inside wrapped methods, by label."""

    seconds: dict[str, float] = field(default_factory=dict)
    calls: Counter = field(default_factory=Counter)

    def wrap(self, obj: Any, attr: str, label: str) -> None:
        """Time ``obj.attr`` (an instance attribute shadows the bound method; the benchmark's instance only)."""
        inner = getattr(obj, attr)
        self.seconds.setdefault(label, 0.0)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - t0
                self.calls[label] += 1

        setattr(obj, attr, timed)


def instrument_vllm(generator: Any, timers: Timers) -> None:
    """Scheduler, forward, sampler, scheduler update (EngineCore) and output processing (detokenizer, stop strings)
    of the in-process engine."""
    llm = generator.engine.engine  # InprocVLLMEngine -> vLLM's LLMEngine
    core = llm.engine_core.engine_core  # InprocClient -> EngineCore
    timers.wrap(core.scheduler, "schedule", "schedule")
    timers.wrap(core.model_executor, "execute_model", "forward")
    timers.wrap(core.model_executor, "sample_tokens", "sample")
    timers.wrap(core.scheduler, "update_from_output", "update")
    timers.wrap(llm.output_processor, "process_outputs", "outputs")


def no_retrieval():
    """The engine comparison's search tool: its model cannot open or close a search (module doc); were it to
    search, the call fails visibly (counted in the table) instead of reaching a server."""
    from rlinf_ext.tools.search import SearchResult, TextSearch

    class NoRetrieval:
        async def search(self, query: str):
            return SearchResult(query=query, ok=False, error="no retrieval in the engine comparison")

    return TextSearch(NoRetrieval())


def engine_run(spec: dict) -> dict:
    """Start one engine, warm it up, run the agent rollout once; figures as a dict."""
    import torch
    from transformers import AutoTokenizer

    from rlinf_ext.agent.searchr1.config import LoopSettings
    from rlinf_ext.agent.searchr1.loop import run_group
    from rlinf_ext.agent.searchr1.protocol import SEARCHR1_STOPS
    from rlinf_ext.protocol.generation import SamplingParams

    name, model_dir = spec["engine"], spec["model_dir"]
    n_seqs = spec["prompts"] * spec["group_size"]
    timers = Timers()
    t0 = time.perf_counter()
    if name == "vllm":
        from rlinf_ext.generation.vllm_engine import VLLMGenerator
        from rlinf_ext.generation.vllm_wire import VLLMEngineOptions

        # no chunked prefill: vLLM 0.32 rewinds a seeded request's generator after a partial prefill with
        # Generator.set_offset, which CPU generators lack ("CPU Generator does not use offset"); whole prompts
        # only, in a budget that holds the longest context
        options = VLLMEngineOptions(
            model_path=model_dir,
            dtype=spec["dtype"],
            seed=spec["seed"],
            max_num_seqs=max(n_seqs, 1),
            max_model_len=spec["max_model_len"],
            kv_cache_memory_bytes=spec["kv_cache_bytes"],
            enable_chunked_prefill=False,
            max_num_batched_tokens=max(8192, spec["max_model_len"]),
        )
        generator = VLLMGenerator.start(options, seed=spec["seed"])
    elif name == "hf":
        from rlinf_ext.generation.hf import HFGenerator

        generator = HFGenerator.from_pretrained(
            model_dir, dtype=spec["dtype"], seed=spec["seed"], max_batch_size=max(n_seqs, 1)
        )
    else:
        raise ValueError(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}")
    start_s = time.perf_counter() - t0
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = spec["prompt_ids"]
    params = SamplingParams(max_new_tokens=spec["max_new_tokens"], temperature=1.0, stop=list(SEARCHR1_STOPS))
    agent_cfg = LoopSettings(
        max_turns=spec["max_turns"], response_length_total=spec["response_length"], max_obs_length=500
    )

    async def warm_up():
        await generator.generate(prompts[0], params.with_updates(max_new_tokens=4))

    async def rollout():
        return await asyncio.gather(
            *(
                run_group(
                    generator,
                    tokenizer,
                    p,
                    ["-"],
                    agent_cfg,
                    [no_retrieval()],
                    spec["group_size"],
                    sampling_params=params,
                )
                for p in prompts
            )
        )

    try:
        asyncio.run(warm_up())
        generator.reseed(spec["seed"])
        if name == "vllm":
            instrument_vllm(generator, timers)
        else:
            timers.wrap(generator.model, "generate", "generate")
            generator.batch_sizes.clear()
        t1, c1 = time.perf_counter(), time.process_time()
        groups = asyncio.run(rollout())
        seconds, cpu_s = time.perf_counter() - t1, time.process_time() - c1
    finally:
        if name == "vllm":
            generator.shutdown()
    trajectories = [t for g in groups for t in g]
    per_turn = [t.generated_tokens for traj in trajectories for t in traj.turns]
    out = {
        "engine": name,
        "start_s": start_s,
        "seconds": seconds,
        "generated_tokens": sum(per_turn),
        "turns": len(per_turn),
        "tokens_per_s": sum(per_turn) / seconds,
        "cpu_s": cpu_s,
        "tokens_per_cpu_s": sum(per_turn) / cpu_s,  # this process's CPU time: less load-bound
        "turn_tokens": dict(Counter(per_turn)),
        "finish_reasons": dict(Counter(t.finish_reason for traj in trajectories for t in traj.turns)),
        "searches": sum(t.metrics["searches"] for t in trajectories),
        "time_s": dict(timers.seconds),
        "calls": dict(timers.calls),
        "torch_threads": torch.get_num_threads(),
    }
    if name == "hf":
        out["batch_sizes"] = dict(Counter(generator.batch_sizes))
    return out


# ------------------------------------------------------------------------------------------------ engines mode
def kv_bytes_per_token(model_dir: str, dtype: str) -> int:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    width = 4 if dtype == "float32" else 2
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * width


def run_engines(args) -> int:
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        raise SystemExit(
            f"--engines: unknown {bad or 'empty list'}; choose from {', '.join(ENGINES)} (comma-separated)"
        )
    work = Path(args.work or tempfile.mkdtemp(prefix="rollout-bench-"))
    tokenizer_dir, train_rows, _, _ = run_in_child(prepare_assets, str(work / "assets"))
    t0 = time.perf_counter()
    model_dir = run_in_child(
        build_bench_model, str(work / "models" / f"{args.shape}-{args.dtype}"), args.shape, tokenizer_dir, args.dtype
    )
    print(f"model {args.shape} ({args.dtype}) ready in {time.perf_counter() - t0:.1f} s: {model_dir}", flush=True)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in Path(train_rows).read_text().splitlines()[: args.prompts]]
    if len(rows) < args.prompts:
        raise SystemExit(f"--prompts {args.prompts}: the tiny assets hold {len(rows)} training prompts")
    prompt_ids = [tok.encode(r["prompt"], add_special_tokens=False) for r in rows]
    max_model_len = max(len(p) for p in prompt_ids) + args.response_length + 64
    n_seqs = args.prompts * args.group_size
    spec = dict(
        model_dir=model_dir,
        dtype=args.dtype,
        seed=args.seed,
        prompts=args.prompts,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        max_turns=args.max_turns,
        response_length=args.response_length,
        prompt_ids=prompt_ids,
        max_model_len=max_model_len,
        kv_cache_bytes=max(64 << 20, int(1.25 * n_seqs * max_model_len * kv_bytes_per_token(model_dir, args.dtype))),
    )
    results: dict[str, dict] = {}
    for name in engines:
        print(f"running {name} ...", flush=True)
        results[name] = run_in_child(engine_run, dict(spec, engine=name))

    baseline = engines[-1]
    threads = ", ".join(f"{n} {r['torch_threads']}" for n, r in results.items())
    print(
        f"\nAgent rollout, vLLM vs HF: shape {args.shape} (random weights), {args.dtype}, CPU "
        f"(torch threads: {threads}); {args.prompts} prompts x group {args.group_size} "
        f"concurrent, max_new_tokens/turn {args.max_new_tokens}, max_turns {args.max_turns}, temperature 1, "
        f"seed {args.seed}\n"
    )
    print(format_engine_table(results, baseline))
    counts = {name: r["generated_tokens"] for name, r in results.items()}
    equal = len(set(counts.values())) == 1
    print(
        f"\nsame token counts on every engine: {'yes' if equal else 'NO: ' + str(counts)}; tokens per turn "
        + "; ".join(f"{n}: {r['turn_tokens']}" for n, r in results.items())
    )
    print(
        "finish reasons: "
        + "; ".join(f"{n}: {r['finish_reasons']}" for n, r in results.items())
        + "; searches: "
        + ", ".join(f"{n} {r['searches']}" for n, r in results.items())
    )
    print("\nwhere the rollout time goes (rest = our async wrapper, agent loop, tokenisation, event loop):")
    for name, r in results.items():
        print(format_breakdown(name, r))
        if "batch_sizes" in r:
            print(f"{'':<6} HF batch sizes {r['batch_sizes']}")
        else:
            steps = r["calls"].get("forward", 0)
            if steps:
                print(
                    f"{'':<6} {steps} engine steps, {1000 * r['seconds'] / steps:.1f} ms per step "
                    f"({1000 * r['time_s']['forward'] / steps:.1f} ms forward)"
                )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "mode": "engines",
                    "args": {k: v for k, v in vars(args).items()},
                    "same_token_counts": equal,
                    "results": results,
                },
                indent=2,
            )
        )
    return 0 if equal else 1


# ------------------------------------------------------------------------------------------------ stop-vs-cut mode
@dataclass
class CutStats:
    turns: int = 0
    reencode_changed: int = 0


class GenerateThenCut:
    """RLinf's way: no stop strings in the engine; cut the text after the first stop, re-encode it."""

    def __init__(self, inner: Any, stats: CutStats):
        self.inner, self.stats = inner, stats

    async def generate(self, prompt_ids, sampling_params):
        from rlinf_ext.protocol.generation import GenerationResult

        stops = list(sampling_params.stop)
        raw = await self.inner.generate(prompt_ids, sampling_params.with_updates(stop=[]))
        tokenizer = self.inner.tokenizer
        text = raw.text
        cuts = [(text.find(s) + len(s), s) for s in stops if s in text]
        self.stats.turns += 1
        if not cuts:
            return GenerationResult(
                raw.output_ids, text, raw.finish_reason, None, raw.logprobs, num_generated=len(raw.output_ids)
            )
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
    from rlinf_ext.agent.searchr1.loop import run_group
    from rlinf_ext.tools import SearchTool, TextSearch, close_http_session

    tool = SearchTool(search_cfg, seed=0)
    started = time.perf_counter()
    try:
        groups = await asyncio.gather(
            *(
                run_group(
                    generator, tokenizer, p, [t], agent_cfg, [TextSearch(tool)], group_size, sampling_params=params
                )
                for p, t in zip(prompts, titles)
            )
        )
    finally:
        await close_http_session()
    result = ModeResult(name, time.perf_counter() - started, [t for g in groups for t in g])
    return result, tool


def run_stop_vs_cut(args) -> int:
    from rlinf_ext.agent.searchr1.config import LoopSettings

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the logits processor is a test double
    from rlinf_ext.agent.searchr1.protocol import SEARCHR1_STOPS
    from rlinf_ext.generation.hf import HFGenerator
    from rlinf_ext.protocol.generation import SamplingParams
    from rlinf_ext.retrieval.build import build_index
    from rlinf_ext.retrieval.config import BuildConfig
    from rlinf_ext.retrieval.launch import RetrievalServerProcess
    from rlinf_ext.tools import SearchToolConfig
    from tests.support.scripted import ForcedActions

    work = Path(args.work or tempfile.mkdtemp(prefix="rollout-bench-"))
    tokenizer_dir, train_rows, corpus_path, tiny_model = prepare_assets(str(work / "assets"))
    index_dir = work / "bm25"
    build_index(BuildConfig(corpus=corpus_path, out=str(index_dir), retriever="bm25"))

    model_dir = Path(args.model) if args.model else Path(tiny_model)
    tokenizer_dir = model_dir if args.model else Path(tokenizer_dir)
    generator = HFGenerator.from_pretrained(
        model_dir, tokenizer_dir, dtype=args.dtype, seed=args.seed, max_batch_size=args.prompts * args.group_size
    )
    tokenizer = generator.tokenizer
    rows = [json.loads(line) for line in Path(train_rows).read_text().splitlines()[: args.prompts]]
    docs = [json.loads(line) for line in Path(corpus_path).read_text().splitlines()[: args.prompts]]
    titles = [d["contents"].split("\n")[0].strip('"') for d in docs]
    prompts = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in rows]

    agent_cfg = LoopSettings(max_turns=args.max_turns, response_length_total=args.response_length, max_obs_length=500)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, stop=list(SEARCHR1_STOPS))

    with RetrievalServerProcess(index_dir, corpus_path, startup_timeout_s=120) as url:
        search_cfg = SearchToolConfig(backend="local", server_addr=url, topk=args.topk, default_timeout=30)
        results, tools = [], []
        for name in ("engine-stop", "generate-then-cut"):
            cut = CutStats()
            gen = generator if name == "engine-stop" else GenerateThenCut(generator, cut)
            mode_results = []
            # a separate run per title so that forced queries differ per prompt
            for prompt, title in zip(prompts, titles):
                generator.logits_processors = [] if args.no_force else [ForcedActions(tokenizer, title, title)]
                generator.reseed(args.seed)
                res, tool = asyncio.run(
                    run_mode(name, gen, tokenizer, [prompt], [title], agent_cfg, search_cfg, params, args.group_size)
                )
                mode_results.append(res)
                tools.append((name, tool))
            merged = ModeResult(
                name,
                sum(r.seconds for r in mode_results),
                [t for r in mode_results for t in r.trajectories],
                cut if name != "engine-stop" else None,
            )
            results.append(merged)

    print(
        f"\nStop strings in the engine vs generate-then-cut (HF engine): {args.prompts} prompts x group "
        f"{args.group_size}, max_new_tokens/turn {args.max_new_tokens}, max_turns {args.max_turns}, model "
        f"{model_dir.name}{'' if args.no_force else ' (actions forced)'}, CPU\n"
    )
    print(f"{'mode':<18} {'turn':>4} {'n':>4} {'generated':>10} {'kept':>8} {'wasted':>8}")
    summary: dict[str, Any] = {}
    for result in results:
        for turn, n, gen_mean, kept_mean in per_turn_table(result):
            waste = 1 - kept_mean / gen_mean if gen_mean else 0.0
            print(f"{result.name:<18} {turn:>4} {n:>4} {gen_mean:>10.1f} {kept_mean:>8.1f} {waste:>7.0%}")
        generated = sum(t.metrics["generated_tokens"] for t in result.trajectories)
        kept = sum(t.metrics["kept_tokens"] for t in result.trajectories)
        summary[result.name] = {
            "seconds": round(result.seconds, 2),
            "generated_tokens": generated,
            "kept_tokens": kept,
            "generated_per_s": round(generated / result.seconds, 1),
            "reencode_changed_turns": None if result.cut is None else result.cut.reencode_changed,
            "cut_turns": None if result.cut is None else result.cut.turns,
        }
    print()
    print(
        f"{'mode':<18} {'time s':>8} {'generated':>10} {'kept':>8} {'kept/generated':>15} {'re-encode changed ids':>22}"
    )
    for name, s in summary.items():
        changed = "-" if s["cut_turns"] is None else f"{s['reencode_changed_turns']}/{s['cut_turns']} turns"
        print(
            f"{name:<18} {s['seconds']:>8.2f} {s['generated_tokens']:>10.0f} {s['kept_tokens']:>8.0f} "
            f"{s['kept_tokens'] / s['generated_tokens']:>15.2f} {changed:>22}"
        )

    latencies = [lat * 1000 for _, tool in tools for lat in tool.stats.latencies_s]
    failures = sum(tool.stats.failures for _, tool in tools)
    if latencies:
        q = statistics.quantiles(latencies, n=20) if len(latencies) > 1 else latencies * 19
        print(
            f"\nsearch latency per call (client side, HTTP to BM25 server on loopback, topk {args.topk}): "
            f"n={len(latencies)} mean {statistics.mean(latencies):.1f} ms, p50 {statistics.median(latencies):.1f} ms, "
            f"p95 {q[18]:.1f} ms, max {max(latencies):.1f} ms, failures {failures}"
        )
        summary["search_latency_ms"] = {
            "n": len(latencies),
            "mean": statistics.mean(latencies),
            "p50": statistics.median(latencies),
            "p95": q[18],
            "max": max(latencies),
        }
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": "stop-vs-cut", "results": summary}, indent=2))
    return 0


# ------------------------------------------------------------------------------------------------ CLI
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=("engines", "stop-vs-cut"), default="engines")
    parser.add_argument("--engines", default="vllm,hf", help="comma-separated, the last is the ratio's baseline")
    parser.add_argument("--shape", choices=SHAPES, default="tiny", help="random-weight model shape (engines mode)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="both engines")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="per turn")
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--response-length", type=int, default=4096, help="agentloop.response_length_total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS of every engine process (on an oversubscribed CPU, more threads than "
        "free cores spin-wait in OpenMP barriers)",
    )
    parser.add_argument("--work", default=None, help="dir for assets and models (reused when given); default: temp")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--model", default=None, help="stop-vs-cut: HF model dir (default: the tiny random Qwen2)")
    parser.add_argument("--no-force", action="store_true", help="stop-vs-cut: do not script the actions")
    parser.add_argument("--topk", type=int, default=3, help="stop-vs-cut: documents per search")
    args = parser.parse_args(argv)
    for name in ("prompts", "group_size", "max_new_tokens", "max_turns", "response_length", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # read by torch (and vLLM, which then keeps torch's thread count) when the engine processes import it
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    return run_engines(args) if args.mode == "engines" else run_stop_vs_cut(args)


if __name__ == "__main__":
    sys.exit(main())
