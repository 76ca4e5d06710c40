"""Actor throughput and peak memory per data-parallel rank of the GRPO training step.

    python benchmarks/train_step_bench.py --shapes tiny 0.5b --dp 2 [--batch 4 --seq 512 --steps 2]

Shapes: ``tiny`` (the test model), ``0.5b`` (Qwen2.5-0.5B dimensions), ``0.5b-l4`` (0.5B width and vocabulary,
4 layers: the 0.5B's per-layer and vocabulary memory at a size two ranks fit in a small machine); random weights
written once as a HF checkpoint and loaded through the conversion mapping like a real run. Each (shape, DP size)
runs in a fresh process group of ``--dp`` CPU ranks (gloo), one sequence per micro-batch, with glibc's mmap
threshold pinned so that freed tensors leave the resident set at once. Per rank: peak RSS above the rank's
baseline (after imports) during the log-prob pass and during the timed training steps; tokens/s of the best step.
Prints one line per run and a table. CPU only (fp32): the GPU figures are scripts/gpu_smoke.py S5.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlinf_ext.models.rss import PeakRSS, rss

REPO = Path(__file__).resolve().parents[1]
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
EXTRA_SHAPES = {"0.5b-l4": ("0.5b", {"num_hidden_layers": 4})}


# ------------------------------------------------------------------------------------------ one rank (child)
def rank_main(rank: int, world: int, port: int, model_dir: str, job: dict, out_dir: str) -> None:
    import torch

    from rlinf_ext.models.cpu_shims import init_parallel_state
    from rlinf_ext.training.data_parallel import shard_layout
    from rlinf_ext.training.grpo_policy import Sample
    from rlinf_ext.training.megatron_policy import MegatronPolicy
    from rlinf_ext.training.rl_math import LossConfig
    from rlinf_ext.training.settings import ActorSettings

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    init_parallel_state(1, 1, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}", seed=0)
    base = rss()
    batch, seq, steps = job["batch"], job["seq"], job["steps"]
    settings = ActorSettings(
        group_size=2,
        n_minibatches=1,
        micro_batch_size=1,
        logprob_micro_batch_size=1,
        loss=LossConfig(kl_beta=0.0),
        lr=1e-6,
        total_train_steps=steps + 1,
    )
    policy = MegatronPolicy(model_dir, settings)
    vocab, prompt = policy.model.hf_vocab_size, seq // 4
    g = torch.Generator().manual_seed(0)
    everyone = [
        Sample(
            torch.randint(0, vocab, (prompt,), generator=g).tolist(),
            torch.randint(0, vocab, (seq - prompt,), generator=g).tolist(),
            [1] * (seq - prompt),
            reward=float(i % 2),
        )
        for i in range(batch)
    ]
    uids = [f"g{k}" for k in range(batch // 2)][rank::world]  # whole GRPO groups per rank
    samples = [s for u in uids for s in everyone[2 * int(u[1:]) : 2 * int(u[1:]) + 2]]
    layout = shard_layout(uids, [2] * len(uids), policy.dp)
    with PeakRSS() as logprob_peak:
        policy.recompute(samples, compute_ref=False)
    policy.train_step(samples, 0, layout)  # warm-up: Adam's moments come to life
    times = []
    with PeakRSS() as train_peak:
        for step in range(1, steps + 1):
            t = time.perf_counter()
            policy.train_step(samples, step, layout)
            times.append(time.perf_counter() - t)
    local_tokens = len(samples) * seq
    result = {
        "rank": rank,
        "params": sum(p.numel() for p in policy.model.parameters()),
        "logprob_peak": logprob_peak.peak - base,
        "train_peak": train_peak.peak - base,
        "tokens_per_s": world * local_tokens / min(times),
        "step_s": min(times),
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()


def child_main(model_dir: str, job: dict, out_dir: str) -> None:
    import torch.multiprocessing as mp

    from rlinf_ext.models.cpu_shims import free_port

    mp.spawn(rank_main, args=(job["dp"], free_port(), model_dir, job, out_dir), nprocs=job["dp"], join=True)


# ------------------------------------------------------------------------------------------ driver
def make_checkpoint(shape: str, out_dir: str) -> str:
    from rlinf_ext.assets.core.random_qwen2 import shape_config, write_random_qwen2

    base, changes = EXTRA_SHAPES.get(shape, (shape, {}))
    write_random_qwen2(out_dir, shape_config(base, **changes))
    return out_dir


def run(model_dir: str, job: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, **MALLOC_ENV, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, __file__, "--child", model_dir, json.dumps(job), out],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{job}: failed\n{proc.stderr[-4000:]}")
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(job["dp"])]


def table(rows: list[dict]) -> None:
    gib = 2**30
    print(f"\n{'shape':<8} {'DP':>2} {'log-prob peak/rank':>20} {'train peak/rank':>18} {'tok/s':>10}")
    for r in sorted(rows, key=lambda r: (r["shape"], r["dp"])):
        print(
            f"{r['shape']:<8} {r['dp']:>2} {r['logprob_peak'] / gib:>16.2f} GiB {r['train_peak'] / gib:>14.2f} GiB "
            f"{r['tokens_per_s']:>10.0f}"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["tiny", "0.5b"], choices=["tiny", "0.5b", "0.5b-l4"])
    ap.add_argument("--dp", type=int, nargs="+", default=[2], help="data-parallel sizes to run (CPU ranks)")
    ap.add_argument("--batch", type=int, default=4, help="trajectories per step (GRPO groups of 2)")
    ap.add_argument("--seq", type=int, default=512, help="tokens per trajectory (prompt + response)")
    ap.add_argument("--steps", type=int, default=2, help="timed training steps (best is reported)")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = make_checkpoint(shape, tmp)
            for dp in args.dp:
                job = {"dp": dp, "batch": args.batch, "seq": args.seq, "steps": args.steps}
                ranks = run(model_dir, job)
                row = {
                    "shape": shape,
                    "dp": dp,
                    **job,
                    "params": ranks[0]["params"],
                    "train_peak": max(r["train_peak"] for r in ranks),
                    "logprob_peak": max(r["logprob_peak"] for r in ranks),
                    "tokens_per_s": ranks[0]["tokens_per_s"],
                    "step_s": ranks[0]["step_s"],
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    table(rows)


if __name__ == "__main__":
    main()
