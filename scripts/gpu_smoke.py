#!/usr/bin/env python
"""One-GPU smoke test of rlinf_ext's GPU path (stages S0-S8), for the lent device (one Hopper GPU), torch with
CUDA, and a few small wheels (megatron-core 0.16.1, rlinf 0.3.0, transformers 5.19.0 + tokenizers + huggingface_hub
first on PYTHONPATH, omegaconf, antlr4, hydra-core, faiss-cpu). No Ray, no SGLang, no Transformer Engine: Ray and
``rlinf.scheduler`` are stubbed inside this script only, and the actor uses Megatron's local layer spec.

    python scripts/gpu_smoke.py --out OUT_DIR [--device cuda|cpu] [--stages S0 S2 ...] [--budget-s 530]

Each stage runs in its own subprocess with its own timeout and appends one JSON line to OUT_DIR/results.jsonl
(``stage, title, status (pass|fail|skipped), seconds, checks {name: bool}, skipped {check: why not run here},
figures {...}, error``), so a crash or
an out-of-memory in a late stage keeps the earlier results. The driver prints every stage's verdict, its figures,
its pass conditions and, on failure, the exception. ``--device cpu`` runs the same stages with tiny shapes on CPU
(tests/scripts/test_gpu_smoke.py). Stages (S5, the longest, last):

  S0 environment   torch/CUDA/GPU/free memory, versions; megatron.core, rlinf.algorithms (stubbed scheduler),
                   transformers, faiss and rlinf_ext import; Transformer Engine present?
  S1 tiny assets   rlinf_ext's offline generator (no SFT); skipped when a package it needs is missing
  S2 converter     HF Qwen2 (eager) vs Megatron GPTModel through hf_to_megatron: fp32, bf16 autocast, left-padded
                   batch; megatron_to_hf round trip
  S3 tiny actor    MegatronPolicy bf16 / fp16 static / fp16 dynamic: train steps, offload/onload, save/load,
                   fp32 log-probs vs HF at temperature 1.0 and 0.7, probe vs an fp16 HF model
  S4 IPC stand-in  fp16 buckets through ForkingPickler into a spawned consumer on the same device
  S6 encoder       dense encoder fp16 on CUDA vs fp32 on CPU (mean, cls), faiss top-k from both
  S7 FSDP2 VL     the vision-language actor fully_shard-ed over a one-rank group (bf16 compute), ~0.4B random
                   Qwen2.5-VL: train steps, activation checkpointing's peak, offload/onload bit-exact, probe through
                   the gathered HF weights (CPU: tiny shape, gloo)
  S8 vLLM          rlinf_ext's VLLMGenerator vs an HF forward of the same random Qwen2: stop strings, processed
                   log-probs at T 0.7 / 1.0, seeds, in-place reload + probe; CUDA: sleep levels 1 and 2 + wake_up
                   measured against models/memory.py's engine terms, the collocated IPC route (VLLMGpuSync) fed by a
                   producer process + probe (skipped without vLLM; vLLM 0.26 on the lent device:
                   scripts/device_vllm_smoke.sh, docs/environment.md)
  S5 3B memory     a Qwen2.5-3B-shaped random actor (fp16, local spec, reference model, recompute full/block/20):
                   peak memory at 1k/2k/3k tokens vs rlinf_ext/models/memory.py's estimate; seconds per step at 2k
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# stage -> (title, timeout in seconds on the GPU; S5 takes what is left of the budget)
STAGES = {
    "S0": ("environment", 60),
    "S1": ("tiny assets", 90),
    "S2": ("converter logits", 60),
    "S3": ("tiny actor", 150),
    "S4": ("IPC weight transport stand-in", 60),
    "S6": ("fp16 dense encoder", 60),
    "S7": ("FSDP2 vision-language actor", 120),
    "S8": ("vLLM generator", 150),
    "S5": ("3B-shaped actor memory", 240),
}


def _child_env() -> dict:
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_stage_process(stage: str, args: argparse.Namespace, timeout: float) -> dict:
    """Run one stage in a subprocess; return its JSON line (written by the child, or here when it died)."""
    results = Path(args.out) / "results.jsonl"
    before = results.read_text().count("\n") if results.is_file() else 0
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--run-stage",
        stage,
        "--out",
        args.out,
        "--device",
        args.device,
        "--work",
        args.work,
    ]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True, timeout=timeout)
        died = None if proc.returncode == 0 else f"exit code {proc.returncode}"
        tail = (proc.stdout + proc.stderr)[-4000:]
    except subprocess.TimeoutExpired as exc:
        died = f"timed out after {timeout:.0f} s"
        tail = ((exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace"))[-4000:]
    lines = results.read_text().splitlines() if results.is_file() else []
    if len(lines) > before:
        return json.loads(lines[-1])
    record = {
        "stage": stage,
        "title": STAGES[stage][0],
        "status": "fail",
        "seconds": round(time.perf_counter() - start, 1),
        "checks": {},
        "figures": {},
        "error": f"the stage process died ({died}) before writing its result:\n{tail}",
    }
    with results.open("a") as f:
        f.write(json.dumps(record) + "\n")
    return record


def print_record(r: dict) -> None:
    print(f"\n== {r['stage']} {r['title']}: {r['status'].upper()} ({r['seconds']} s)", flush=True)
    for name, ok in r.get("checks", {}).items():
        print(f"   [{'ok' if ok else 'FAILED'}] {name}")
    for name, why in r.get("skipped", {}).items():
        print(f"   [skipped] {name}: {why}")
    for key, value in r.get("figures", {}).items():
        print(f"   {key}: {value}")
    if r.get("error"):
        print("   error: " + r["error"].replace("\n", "\n   "))


def drive(args: argparse.Namespace) -> int:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    records = []
    scale = args.timeout_scale or (1.0 if args.device == "cuda" else 3.0)
    for stage in [s for s in STAGES if s in args.stages]:
        left = deadline - time.monotonic()
        own = STAGES[stage][1] * scale
        timeout = min(own, left) if stage != "S5" else max(min(own, left), 30)
        if left < 15:
            record = {
                "stage": stage,
                "title": STAGES[stage][0],
                "status": "skipped",
                "seconds": 0,
                "checks": {},
                "figures": {},
                "error": f"no time left in the {args.budget_s} s budget",
            }
            with (Path(args.out) / "results.jsonl").open("a") as f:
                f.write(json.dumps(record) + "\n")
        else:
            record = run_stage_process(stage, args, timeout)
        print_record(record)
        records.append(record)
    failed = [r["stage"] for r in records if r["status"] == "fail"]
    verdicts = ", ".join(f"{r['stage']} {r['status']}" for r in records)
    print(f"\nsummary: {verdicts}; results in {Path(args.out) / 'results.jsonl'}", flush=True)
    return 1 if failed else 0


def run_one(args: argparse.Namespace) -> int:
    """In the stage process: the stage's function (stage modules are imported here only, after the stubs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import smoke_common
    import smoke_stages_actor as actor
    import smoke_stages_io as io
    import smoke_stages_vl as vl
    import smoke_stages_vllm as vllm_stage

    functions = {
        "S0": actor.s0_environment,
        "S1": actor.s1_assets,
        "S2": actor.s2_converter,
        "S3": actor.s3_actor,
        "S4": io.s4_ipc,
        "S5": io.s5_memory,
        "S6": io.s6_encoder,
        "S7": vl.s7_fsdp_vl,
        "S8": vllm_stage.s8_vllm,
    }
    return smoke_common.run_stage(
        args.run_stage, STAGES[args.run_stage][0], functions[args.run_stage], args, stubs=args.run_stage != "S8"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (results.jsonl is appended to)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: tiny shapes on CPU")
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    ap.add_argument("--work", default=None, help="scratch directory for generated models (default OUT/work)")
    ap.add_argument("--budget-s", type=float, default=530.0, help="wall-clock budget of the whole run")
    ap.add_argument(
        "--timeout-scale", type=float, default=None, help="multiply every stage's timeout (default 1 on cuda, 3 on cpu)"
    )
    ap.add_argument("--run-stage", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.work = args.work or str(Path(args.out) / "work")
    if args.run_stage:
        code = run_one(args)  # its record is written and closed
        sys.stdout.flush()
        sys.stderr.flush()
        # no interpreter teardown of the torch/Megatron/vLLM stack the stage loaded (~1 CPU-s per stage on CPU; on a
        # GPU it also skips collective and CUDA teardown, which can hang after a failed stage)
        os._exit(code)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
