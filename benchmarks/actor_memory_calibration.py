"""Calibrate the actor memory estimate (rlinf_ext/models/memory.py) against the real actor's peak memory on CPU.

    python benchmarks/actor_memory_calibration.py [--cases tiny-2048 tiny-2048-rc 0.5b-512 0.5b-512-rc]

Each case runs in a fresh process with glibc's mmap threshold pinned (MALLOC_MMAP_THRESHOLD_=131072), so every
tensor is its own mapping, freed memory leaves the resident set at once and the peak resident set size is the
peak of live tensors. A random HF checkpoint of the shape (assets/random_qwen2.py) is loaded through the
conversion mapping like a real run; the actor runs fp32 with Megatron's local layer spec (the CPU profile), one
sequence per micro-batch. Phases: baseline (imports, process group) -> policy built -> log-prob pass -> two
training steps (the second is measured: Adam's moments exist by then). Reported per case: measured (RSS above
the baseline) vs estimated, and their ratio, for the static memory (after the steps) and the training peak.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FULL_UNIFORM = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
# name: (shape, tokens per sequence, recompute settings, kl_beta)
CASES = {
    "tiny-2048": ("tiny", 2048, {}, 0.1),
    "tiny-2048-rc": ("tiny", 2048, FULL_UNIFORM, 0.1),
    "0.5b-512": ("0.5b", 512, {}, 0.0),
    "0.5b-512-rc": ("0.5b", 512, FULL_UNIFORM, 0.0),
}

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the same pinned allocator and RSS sampling as the train-step benchmark
from train_step_bench import MALLOC_ENV, PeakRSS, rss  # noqa: E402


def estimate(shape: str, seq: int, recompute: dict, kl_beta: float, chunk: int):
    from rlinf_ext.assets.core.random_qwen2 import shape_config
    from rlinf_ext.models.memory import ActorMemoryInputs, ModelShape, estimate_actor

    c = shape_config(shape)
    model = ModelShape(
        c["num_hidden_layers"],
        c["hidden_size"],
        c["intermediate_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["hidden_size"] // c["num_attention_heads"],
        c["vocab_size"],
        c["tie_word_embeddings"],
    )
    return estimate_actor(
        ActorMemoryInputs(
            model,
            seq,
            precision="fp32",
            device="cpu",
            data_parallel=1,
            distributed_optimizer=False,
            reference_model=kl_beta > 0,
            flash_attention=False,
            logprob_chunk_tokens=chunk,
            **recompute,
        )
    )


def run_case(name: str, model_dir: str) -> dict:
    """In the measuring process: build the actor, run the phases, return the figures (bytes)."""
    import torch

    from rlinf_ext.models.cpu_shims import init_parallel_state
    from rlinf_ext.training.grpo_policy import Sample
    from rlinf_ext.training.megatron_policy import MegatronPolicy
    from rlinf_ext.training.rl_math import LossConfig
    from rlinf_ext.training.settings import ActorSettings

    shape, seq, recompute, kl_beta = CASES[name]
    torch.set_num_threads(2)
    init_parallel_state(1, 1)
    gc.collect()
    base = rss()
    settings = ActorSettings(
        group_size=2,
        n_minibatches=1,
        micro_batch_size=1,
        logprob_micro_batch_size=1,
        loss=LossConfig(kl_beta=kl_beta),
        lr=1e-6,
        total_train_steps=2,
        model_overrides=recompute,
    )
    policy = MegatronPolicy(model_dir, settings)
    gc.collect()
    built = rss() - base
    vocab = policy.model.hf_vocab_size
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(
            torch.randint(0, vocab, (seq // 4,), generator=g).tolist(),
            torch.randint(0, vocab, (seq - seq // 4,), generator=g).tolist(),
            [1] * (seq - seq // 4),
            reward=float(i % 2),
        )
        for i in range(2)
    ]
    with PeakRSS() as logprob_pass:
        policy.recompute(samples, compute_ref=kl_beta > 0)
    policy.train_step(samples, 0)  # Adam's moments come to life here
    gc.collect()
    with PeakRSS() as train:
        policy.train_step(samples, 1)
    gc.collect()
    est = estimate(shape, seq, recompute, kl_beta, settings.logprob_chunk_tokens)
    return {
        "case": name,
        "params": sum(p.numel() for p in policy.model.parameters()),
        "built": built,
        "static": rss() - base,
        "logprob_peak": logprob_pass.peak - base,
        "train_peak": train.peak - base,
        "est_static": est.static,
        "est_peak": est.peak,
        "est_items": est.items,
    }


def measure(name: str) -> dict:
    """Run one case in a fresh process (pinned malloc thresholds) and return its figures."""
    from rlinf_ext.assets.core.random_qwen2 import write_random_qwen2

    with tempfile.TemporaryDirectory() as tmp:
        write_random_qwen2(tmp, CASES[name][0])
        env = {**os.environ, **MALLOC_ENV, "PYTHONPATH": str(REPO)}
        out = subprocess.run(
            [sys.executable, __file__, "--child", name, tmp], env=env, capture_output=True, text=True, check=False
        )
    if out.returncode != 0:
        raise RuntimeError(f"case {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(rows: list[dict]) -> None:
    gib = 2**30
    print(
        f"{'case':<14} {'params':>8} {'static meas':>11} {'est':>7} {'ratio':>6} {'peak meas':>10} {'est':>7} "
        f"{'ratio':>6}  (GiB above the process baseline)"
    )
    for r in rows:
        print(
            f"{r['case']:<14} {r['params'] / 1e6:>7.1f}M {r['static'] / gib:>11.3f} {r['est_static'] / gib:>7.3f} "
            f"{r['static'] / r['est_static']:>6.2f} {r['train_peak'] / gib:>10.3f} {r['est_peak'] / gib:>7.3f} "
            f"{r['train_peak'] / r['est_peak']:>6.2f}"
        )
    for r in rows:
        items = ", ".join(f"{k} {v / gib:.3f}" for k, v in r["est_items"].items())
        print(f"  {r['case']}: estimate items (GiB): {items}; log-prob pass peak {r['logprob_peak'] / gib:.3f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(run_case(sys.argv[2], sys.argv[3])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=sorted(CASES))
    args = ap.parse_args()
    rows = []
    for name in args.cases:
        rows.append(measure(name))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "est_items"}), flush=True)
    report(rows)


if __name__ == "__main__":
    main()
