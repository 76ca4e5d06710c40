"""Actor throughput: tokens/s and peak memory of the GRPO training step and of log-prob recomputation.

    python benchmarks/train_step_bench.py --shapes tiny 0.5b [--batch 4 --seq 256 --steps 2]

Shapes: ``tiny`` (the test model: 2 layers, hidden 64) and ``0.5b`` (Qwen2.5-0.5B dimensions, random
weights). The weights are written once as a HF checkpoint in a temp dir and loaded through the conversion
mapping like a real run. Runs on CUDA when available (fp32 on CPU). Prints one line per shape and phase.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import psutil
import torch

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1472, tie_word_embeddings=True),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
}


class PeakRSS:
    """Peak resident memory (CPU) sampled every 10 ms, or CUDA peak allocated memory."""

    def __enter__(self):
        self.proc = psutil.Process(os.getpid())
        self.peak = self.proc.memory_info().rss
        self._stop = False
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self._stop:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    def __exit__(self, *exc):
        self._stop = True
        self.thread.join()
        self.gpu_peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None


def make_hf_model(shape: str, out_dir: str) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**SHAPES[shape], rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096,
                      torch_dtype="float32")
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out_dir)
    return out_dir


def bench(shape: str, batch: int, seq: int, steps: int) -> None:
    from rlinf_ext.training.policy import MegatronPolicy, Sample
    from rlinf_ext.training.rl_math import LossConfig
    from rlinf_ext.training.settings import ActorSettings

    with tempfile.TemporaryDirectory() as tmp:
        path = make_hf_model(shape, tmp)
        settings = ActorSettings(group_size=2, n_minibatches=1, micro_batch_size=1, logprob_micro_batch_size=batch,
                                 loss=LossConfig(kl_beta=0.0), lr=1e-6, total_train_steps=steps)
        policy = MegatronPolicy(path, settings)
    vocab = policy.model.hf_vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = seq // 4
    samples = [Sample(torch.randint(0, vocab, (prompt,), generator=g).tolist(),
                      torch.randint(0, vocab, (seq - prompt,), generator=g).tolist(),
                      [1] * (seq - prompt), reward=float(i % 2)) for i in range(batch)]
    tokens = batch * seq
    n_params = sum(p.numel() for p in policy.model.parameters())
    device = policy.device
    for phase in ("recompute", "train"):
        times = []
        with PeakRSS() as mem:
            for step in range(steps):
                t = time.perf_counter()
                if phase == "recompute":
                    policy.recompute(samples, compute_ref=False)
                else:
                    policy.train_step(samples, step)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
        best = min(times)
        peak = f"gpu_peak={mem.gpu_peak / 2**30:.2f}GiB" if mem.gpu_peak else f"rss_peak={mem.peak / 2**30:.2f}GiB"
        print(f"shape={shape} params={n_params / 1e6:.1f}M device={device} threads={torch.get_num_threads()} "
              f"phase={phase} batch={batch} seq={seq} tokens/s={tokens / best:.0f} step_s={best:.2f} {peak}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["tiny", "0.5b"], choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=4, help="Trajectories per step.")
    ap.add_argument("--seq", type=int, default=256, help="Tokens per trajectory (prompt + response).")
    ap.add_argument("--steps", type=int, default=2, help="Timed repetitions per phase (best is reported).")
    args = ap.parse_args()
    for shape in args.shapes:
        bench(shape, args.batch, args.seq, args.steps)


if __name__ == "__main__":
    main()
