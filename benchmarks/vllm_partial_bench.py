"""What a weight sync costs the turns in flight on vLLM, with and without partial rollout (``runner.partial_rollout``):
the pause of ``wait`` mode (the sync waits for every turn to end) against vLLM's ``keep`` mode (the turns stop after
the step in progress and go on after the load, their KV computed again on the new weights).

    python benchmarks/vllm_partial_bench.py [--turns 8] [--tokens 256] [--after-ms 50] [--repeats 3]

Not a test: it measures. One in-process CPU engine (``generation/vllm_engine.py``, as the CPU rollout worker runs it)
on the contract's tiny Qwen2 (random weights, a small trained tokenizer, written to a temp dir); ``--turns`` greedy
turns of ``--tokens`` tokens each are submitted, and ``--after-ms`` later a sync loads the same weights again under
a new label. Printed per mode (median of ``--repeats``): the pause (until the load may start), the whole sync, the
turns' wall time from submission to the last reply, and the share of tokens labelled by the new weights.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlinf_ext.generation.vllm_engine import VLLMGenerator  # noqa: E402
from rlinf_ext.generation.vllm_wire import VLLMEngineOptions  # noqa: E402
from rlinf_ext.protocol.generation import SamplingParams  # noqa: E402


def write_model(out: Path) -> tuple[Path, dict]:
    from rlinf_ext.assets.core.models import TinyQwen2Shape, make_qwen2, save_hf_model
    from rlinf_ext.assets.core.tokenizer import train_tokenizer

    texts = [
        f"Question {i}: which city is the capital of country {i % 17}? <search> capital of country {i % 17} "
        f"</search> <answer> city {i * 7 % 23} </answer>"
        for i in range(400)
    ]
    tok = train_tokenizer(texts, vocab_size=800)
    model = make_qwen2(tok, TinyQwen2Shape(), seed=1)
    save_hf_model(model, tok, out)
    return out, dict(model.state_dict())


async def one_sync(
    gen: VLLMGenerator,
    prompts: list[list[int]],
    params: SamplingParams,
    after_s: float,
    keep: bool,
    state: dict,
    version: int,
) -> dict:
    await gen.label_weights(version - 1)
    t0 = time.perf_counter()
    turns = asyncio.gather(*(gen.generate(p, params) for p in prompts))
    await asyncio.sleep(after_s)
    t_sync = time.perf_counter()
    await gen.begin_weight_load(keep=keep)
    t_paused = time.perf_counter()
    await gen.load_weight_bucket(list(state.items()))
    await gen.finish_weight_load(version)
    t_synced = time.perf_counter()
    results = await turns
    t_end = time.perf_counter()
    labels = [
        v
        for r in results
        for v in (r.weight_version if isinstance(r.weight_version, list) else [r.weight_version] * len(r.output_ids))
    ]
    return {
        "pause_s": t_paused - t_sync,
        "sync_s": t_synced - t_sync,
        "turns_s": t_end - t0,
        "new_share": sum(v == version for v in labels) / max(len(labels), 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256, help="max_new_tokens of each turn")
    ap.add_argument("--after-ms", type=float, default=50.0, help="the sync starts this long after the turns")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, state = write_model(Path(tmp) / "model")
        gen = VLLMGenerator.start(
            VLLMEngineOptions(
                model_path=str(model_dir), max_model_len=1024, kv_cache_memory_bytes=64 << 20, max_num_seqs=64
            )
        )
        try:
            prompts = [
                gen.tokenizer.encode(f"Question {i}: who wrote the book?\n", add_special_tokens=False)
                for i in range(args.turns)
            ]
            params = SamplingParams(max_new_tokens=args.tokens, stop=[], do_sample=False)
            asyncio.run(one_sync(gen, prompts, params, args.after_ms / 1000, False, state, 1))  # warm-up
            rows = {}
            for mode, keep in (("wait", False), ("keep", True)):
                runs = [
                    asyncio.run(one_sync(gen, prompts, params, args.after_ms / 1000, keep, state, 2 + i))
                    for i in range(args.repeats)
                ]
                rows[mode] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        finally:
            gen.shutdown()
    print(f"\n{args.turns} turns x {args.tokens} tokens, sync {args.after_ms:.0f} ms after; median of {args.repeats}")
    print(f"{'mode':<6} {'pause s':>8} {'sync s':>8} {'turns s':>8} {'tokens on new weights':>22}")
    for mode, r in rows.items():
        print(f"{mode:<6} {r['pause_s']:>8.3f} {r['sync_s']:>8.3f} {r['turns_s']:>8.3f} {r['new_share']:>22.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
