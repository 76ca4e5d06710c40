"""Megatron → HF conversion benchmark: rlinf_ext's converter vs the one shipped in rlinf==0.3.0.

Creates a synthetic Megatron checkpoint with Qwen2.5 shapes (random bf16 weights, TP=2 by default, TE
layer-norm names and `_extra_state` entries as RLinf writes them), converts it with both tools — each
in its own subprocess, sampling the summed RSS of its process tree — and compares the two outputs
tensor by tensor.

    python benchmarks/convert_bench.py                       # Qwen2.5-1.5B shapes, TP=2
    python benchmarks/convert_bench.py --preset qwen2.5-3b --rlinf-procs 16

RLinf's path is its two documented steps (convert_mg_to_middle_file, convert_middle_file_to_hf); its
time and memory are the sum / max over both. Needs ~4× the checkpoint size of free disk in --workdir.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import torch

from rlinf_ext.convert.mapping import LINEAR_MODULES, ConvertSpec, mg_name, preset_hf_config, unit_stage, units
from rlinf_ext.convert.mg_checkpoint import RANK_FILE, save_rank_file
from rlinf_ext.convert.tensor_math import expected_mg_shape

RLINF_MODEL_NAMES = {"qwen2.5-1.5b": "Qwen2.5-1.5B", "qwen2.5-3b": "Qwen2.5-3B", "qwen2.5-7b": "Qwen2.5-7B"}
RLINF_MODULE = "rlinf.utils.ckpt_convertor.megatron_convertor"


# --------------------------------------------------------------------------- synthetic checkpoint


def write_template(preset: str, out: Path) -> dict:
    cfg = preset_hf_config(preset)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"]}))
    return cfg


def _random(name: str, shape, dtype) -> torch.Tensor:
    # seeded by name: replicated tensors (norms) come out identical on every TP rank
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * 0.02).to(dtype)


def write_synthetic_checkpoint(cfg: dict, actor: Path, tp: int, iteration: int = 1) -> int:
    """RLinf-style TP checkpoint with random weights; returns its size in bytes."""
    spec = ConvertSpec.from_hf_config(cfg)
    extra = torch.frombuffer(bytearray(pickle.dumps(None)), dtype=torch.uint8).clone()
    total = 0
    for t in range(tp):
        state: dict = {}
        for unit, layer in units(spec):
            _, local = unit_stage(spec, unit, layer, 1)
            for rule in spec.rules(unit):
                name = mg_name(rule, local, te=True)
                shape = expected_mg_shape(spec, rule, tp)
                key = name if rule.kind.value == "replicated" else f"{name}@tp{t}"
                state[name] = _random(key, shape, torch.bfloat16)
            if unit == "layer":
                for module in LINEAR_MODULES:
                    state[f"decoder.layers.{local}.{module}._extra_state"] = extra
        path = actor / f"iter_{iteration:07d}" / f"mp_rank_{t:02d}" / RANK_FILE
        save_rank_file(path, state, iteration)
        total += path.stat().st_size
        del state
    return total


# --------------------------------------------------------------------------- measuring


def run_measured(cmd: list[str], cwd: Path | None = None) -> dict:
    """Run a command; wall time and peak of the summed RSS over its process tree (50 ms sampling)."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = {"tree": 0, "single": 0}
    stop = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                rss = []
                for p in procs:
                    try:
                        rss.append(p.memory_info().rss)
                    except psutil.Error:
                        pass
                peak["tree"] = max(peak["tree"], sum(rss))
                peak["single"] = max(peak["single"], max(rss, default=0))
            except psutil.Error:
                pass
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    stop.set()
    sampler.join()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{output[-3000:]}")
    return {"wall_s": wall, "peak_rss_tree": peak["tree"], "peak_rss_single": peak["single"]}


def run_ours(actor: Path, template: Path, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "rlinf_ext.cli",
        "convert",
        "mg2hf",
        "--mg",
        str(actor),
        "--out",
        str(out),
        "--hf-template",
        str(template),
        "--quiet",
    ]
    return run_measured(cmd)


def run_rlinf(actor: Path, cfg: dict, preset: str, middle: Path, out: Path, tp: int, procs: int) -> dict:
    model = RLINF_MODEL_NAMES[preset]
    tie = "true" if cfg["tie_word_embeddings"] else "false"
    step1 = [
        sys.executable,
        "-m",
        f"{RLINF_MODULE}.convert_mg_to_middle_file",
        "--load-path",
        str(actor),
        "--save-path",
        str(middle),
        "--model",
        model,
        "--tp-size",
        str(tp),
        "--ep-size",
        "1",
        "--pp-size",
        "1",
        "--te-ln-linear-qkv",
        "true",
        "--te-ln-linear-mlp_fc1",
        "true",
        "--te-extra-state-check-none",
        "true",
        "--tie-word-embeddings",
        tie,
        "--num-layers",
        str(cfg["num_hidden_layers"]),
        "--use-gpu-num",
        "0",
        "--process-num",
        str(procs),
        "--disable-tqdm",
    ]
    step2 = [
        sys.executable,
        "-m",
        f"{RLINF_MODULE}.convert_middle_file_to_hf",
        "--load-path",
        str(middle),
        "--save-path",
        str(out),
        "--model",
        model,
        "--tie-word-embeddings",
        tie,
        "--num-layers",
        str(cfg["num_hidden_layers"]),
        "--use-gpu-num",
        "0",
        "--process-num",
        str(procs),
        "--disable-tqdm",
    ]
    a, b = run_measured(step1), run_measured(step2)
    return {
        "wall_s": a["wall_s"] + b["wall_s"],
        "peak_rss_tree": max(a["peak_rss_tree"], b["peak_rss_tree"]),
        "peak_rss_single": max(a["peak_rss_single"], b["peak_rss_single"]),
        "steps_wall_s": [a["wall_s"], b["wall_s"]],
    }


def compare_outputs(ours: Path, theirs: Path) -> dict:
    """Tensor-by-tensor equality (read one tensor at a time)."""
    from safetensors import safe_open

    def index(folder: Path) -> dict[str, Path]:
        where = {}
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    where[k] = f
        return where

    a, b = index(ours), index(theirs)
    only_ours, only_theirs = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    different = []
    for name in sorted(set(a) & set(b)):
        with safe_open(str(a[name]), framework="pt") as ha, safe_open(str(b[name]), framework="pt") as hb:
            x, y = ha.get_tensor(name), hb.get_tensor(name)
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
            different.append(name)
    return {
        "tensors_compared": len(set(a) & set(b)),
        "only_ours": only_ours,
        "only_rlinf": only_theirs,
        "different": different,
        "identical": not (only_ours or only_theirs or different),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen2.5-1.5b", choices=sorted(RLINF_MODEL_NAMES), help="model shapes")
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel size of the synthetic checkpoint")
    ap.add_argument(
        "--rlinf-procs", type=int, default=2, help="RLinf --process-num (its docs use 16; 2 = the cores here)"
    )
    ap.add_argument("--workdir", default="/tmp/convert_bench", help="scratch folder (removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint and outputs")
    ap.add_argument(
        "--reuse", action="store_true", help="reuse a checkpoint kept in --workdir by an earlier --keep run"
    )
    args = ap.parse_args(argv)

    work = Path(args.workdir)
    template, actor = work / "template", work / "global_step_1" / "actor"
    reuse = (
        args.reuse
        and (template / "config.json").is_file()
        and actor.is_dir()
        and json.loads((template / "config.json").read_text()) == preset_hf_config(args.preset)
    )
    if not reuse:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    for stale in ("rlinf_middle", "rlinf_hf", "ours_hf"):
        shutil.rmtree(work / stale, ignore_errors=True)
    try:
        if reuse:
            cfg = preset_hf_config(args.preset)
            size = sum(f.stat().st_size for f in actor.rglob("*.pt"))
            print(f"reusing {actor} ({size / 1e9:.2f} GB)")
        else:
            cfg = write_template(args.preset, template)
            t0 = time.perf_counter()
            size = write_synthetic_checkpoint(cfg, actor, args.tp)
            print(
                f"synthetic {args.preset} TP={args.tp} checkpoint: {size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f}s"
            )

        # flush dirty pages before each run so neither pays for the other's writes
        os.sync()
        ours = run_ours(actor, template, work / "ours_hf")
        os.sync()
        theirs = run_rlinf(actor, cfg, args.preset, work / "rlinf_middle", work / "rlinf_hf", args.tp, args.rlinf_procs)
        shutil.rmtree(work / "rlinf_middle", ignore_errors=True)
        cmp = compare_outputs(work / "ours_hf", work / "rlinf_hf")

        gb = 1024**3
        print(f"\n{'':28}{'rlinf_ext':>12}{'rlinf 0.3.0':>14}{'ratio':>10}")
        print(
            f"{'wall time (s)':28}{ours['wall_s']:12.1f}{theirs['wall_s']:14.1f}{theirs['wall_s'] / ours['wall_s']:9.2f}x"
        )
        print(
            f"{'peak RSS, process tree (GiB)':28}{ours['peak_rss_tree'] / gb:12.2f}{theirs['peak_rss_tree'] / gb:14.2f}"
            f"{ours['peak_rss_tree'] / theirs['peak_rss_tree']:10.2f}"
        )
        print(
            f"{'peak RSS, one process (GiB)':28}{ours['peak_rss_single'] / gb:12.2f}{theirs['peak_rss_single'] / gb:14.2f}"
            f"{ours['peak_rss_single'] / theirs['peak_rss_single']:10.2f}"
        )
        print(
            f"RLinf steps (mg->middle, middle->hf): {theirs['steps_wall_s'][0]:.1f}s + {theirs['steps_wall_s'][1]:.1f}s, "
            f"--process-num {args.rlinf_procs}"
        )
        verdict = "IDENTICAL" if cmp["identical"] else "DIFFERENT"
        print(
            f"outputs: {cmp['tensors_compared']} tensors compared, {verdict}"
            + (
                ""
                if cmp["identical"]
                else f" (only ours {cmp['only_ours'][:5]}, only rlinf {cmp['only_rlinf'][:5]}, "
                f"different {cmp['different'][:5]})"
            )
        )
        result = {
            "preset": args.preset,
            "tp": args.tp,
            "checkpoint_bytes": size,
            "rlinf_procs": args.rlinf_procs,
            "ours": ours,
            "rlinf": theirs,
            "compare": cmp,
        }
        print("RESULT " + json.dumps(result))
        return 0 if cmp["identical"] else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
