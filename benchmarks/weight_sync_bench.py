"""Actor -> rollout weight sync: bytes and seconds per sync, the old serial path vs the two routes of
``sync/weight_sync.py``, with 2 data-parallel actor processes and 2 rollout engines on a CPU Ray cluster.

    python benchmarks/weight_sync_bench.py [--shapes tiny 0.5b --repeats 3 --bucket-mb 1024 --rollout-dtype bfloat16]

Real RLinf workers (``ActorWorker`` DP=2 with fp32 master weights, ``HFRolloutWorker`` x2 holding bf16
weights as a GPU engine would, gloo) on random weights of the given shape (``tiny``: 2 layers, hidden 64; ``0.5b``: Qwen2.5-0.5B dimensions), written once as a HF checkpoint in a
temp dir and read by both sides like a real run; the probe check runs in every path. Paths:
  old        what this project did before: actor rank 0 converts the whole state, then sends it to each rollout
             rank in turn (a dataclass of tensors over gloo); the other actor rank idles;
  paired     collocated route: every actor rank converts its own copy bucket by bucket into shared memory and
             hands its engine handles (the CPU stand-in of CUDA IPC), both pairs in parallel;
  broadcast  disaggregated route: actor rank 0 broadcasts each bucket to both engines (RLinf's Worker.broadcast).
Printed per path: the weights' bytes, the bytes that crossed a process boundary, the copies of the weights
made on the way (counted from the code path, see COPIES), and seconds per sync (median of --repeats, after one
warm-up sync that also sets up the communication groups). CPU figures: on GPUs the paired route moves no bytes
at all across the boundary (CUDA IPC) and the old path's gloo sends become the bottleneck.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step_bench import make_checkpoint  # noqa: E402  (the same random shapes as the actor benchmark)

from rlinf_ext.assets.core.random_qwen2 import QWEN2_SHAPES  # noqa: E402
from rlinf_ext.runner.groups import cpu_strategy, wait_all_or_raise, wait_or_raise  # noqa: E402
from rlinf_ext.workers.actor import ActorWorker  # noqa: E402
from rlinf_ext.workers.rollout_hf import HFRolloutWorker  # noqa: E402
from rlinf_ext.sync.weight_sync import (  # noqa: E402
    HFWeightLoader,
    SyncRoutes,
    check_logits_match,
    probe_ids,
    rollout_dtype,
)

# Copies of the weights per sync, per engine, from the code path: old = conversion (cat) + gloo receive into new
# tensors + copy into the model; paired = conversion + pack into the shared bucket + copy into the model (the
# handle maps the same memory); broadcast = conversion + pack + gloo receive + copy into the model.
COPIES = {"old": 3, "paired": 3, "broadcast": 4}


@dataclass
class LegacyPayload:  # the old SyncPayload: the whole HF state in one message
    hf_state: dict
    probe_ids: torch.Tensor
    probe_logits: torch.Tensor
    version: int = 0


class BenchActor(ActorWorker):
    def legacy_sync(self, n_rollout: int) -> dict:
        """The serial path this project used before: rank 0 converts everything, then sends to each engine in turn."""
        if self._rank != 0:
            return {"tensor_bytes": 0, "wire_bytes": 0}
        hf_state = self.policy.hf_state_dict(dtype=rollout_dtype(self.cfg))
        ids = probe_ids(self.policy.model.hf_vocab_size)
        payload = LegacyPayload(hf_state, ids, self.policy.probe_logits(ids), self.policy.optimizer_steps)
        for dst in range(n_rollout):
            self.send(payload, self.cfg.rollout.group_name, dst)
        nbytes = sum(t.numel() * t.element_size() for t in hf_state.values())
        return {"tensor_bytes": nbytes, "wire_bytes": nbytes * n_rollout}


class BenchRollout(HFRolloutWorker):
    async def legacy_sync(self) -> float:
        payload = await self.recv(self.cfg.actor.group_name, 0, async_op=True).async_wait()
        loader = HFWeightLoader(self.generator.model)
        loader.load(payload.hf_state.items())
        loader.finish()
        with torch.no_grad():
            logits = self.generator.model(input_ids=payload.probe_ids).logits.float()
        return check_logits_match(payload.probe_logits, logits, self.sync_atol)


def config(model_dir: Path, tiny_root: Path, out_dir: Path, dtype: str):
    from rlinf_ext.config.loader import load_config

    overrides = {"paths.tiny_assets": str(tiny_root), "rollout.model.model_path": str(model_dir),
                 "rollout.hf.dtype": dtype,
                 "runner.output_dir": str(out_dir), "cluster.component_placement": "{actor: 0-1, rollout: 0-1, reward: 0}",
                 "algorithm.kl_beta": 0.0, "data.rollout_batch_size": 8,
                 "retrieval.launch": False, "tools.search.server_addr": "127.0.0.1:1"}
    return load_config("tiny-cpu", [f"{k}={v}" for k, v in overrides.items()])


def one_sync(path: str, actor, rollout) -> tuple[float, dict]:
    started = time.perf_counter()
    if path == "old":
        sent, _ = wait_all_or_raise([(actor.legacy_sync(2), "actor", "legacy_sync"),
                                     (rollout.legacy_sync(), "rollout", "legacy_sync")])
        return time.perf_counter() - started, sent[0]
    sent, _ = wait_all_or_raise([(actor.sync_model_to_rollout(True), "actor", "sync_model_to_rollout"),
                                 (rollout.sync_model_from_actor(), "rollout", "sync_model_from_actor")])
    return time.perf_counter() - started, {k: sum(s[k] for s in sent) for k in ("tensor_bytes", "wire_bytes")}


def bench(shape: str, repeats: int, bucket_bytes: int, dtype: str, tiny_root: Path, cluster) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(make_checkpoint(shape, str(Path(tmp) / "model")))
        for name in os.listdir(tiny_root / "models" / "qwen2-tiny"):  # the engines need a tokenizer to start
            if "token" in name or name.endswith(".jinja"):
                shutil.copy(tiny_root / "models" / "qwen2-tiny" / name, model_dir / name)
        cfg = config(model_dir, tiny_root, Path(tmp) / "runs", dtype)
        actor = BenchActor.create_group(cfg, 1).launch(cluster, placement_strategy=cpu_strategy(2),
                                                       name=cfg.actor.group_name)
        # a bf16 engine differs from the fp32 actor by rounding: the probe check gets a rounding-sized tolerance
        atol = 1e-3 if dtype == "float32" else 0.25
        rollout = BenchRollout.create_group(cfg, sync_atol=atol).launch(cluster, placement_strategy=cpu_strategy(2),
                                                                        name=cfg.rollout.group_name)
        for handle, name in ((actor.init_worker(), "actor"), (rollout.init_worker(), "rollout")):
            wait_or_raise(handle, name, "init_worker", startup=True)
        try:
            for path in ("old", "paired", "broadcast"):
                if path != "old":
                    routes = SyncRoutes(path, 2, 2)
                    wait_or_raise(actor.set_weight_sync(routes, bucket_bytes), "actor", "set_weight_sync")
                    wait_or_raise(rollout.set_weight_sync(routes), "rollout", "set_weight_sync")
                first, _ = one_sync(path, actor, rollout)
                runs = [one_sync(path, actor, rollout) for _ in range(repeats)]
                seconds = statistics.median(t for t, _ in runs)
                moved = runs[-1][1]
                weights = moved["tensor_bytes"] if path != "paired" else moved["tensor_bytes"] // 2
                print(f"shape={shape} path={path:9s} weights={weights / 2**20:8.1f}MiB "
                      f"crossed_processes={moved['wire_bytes'] / 2**20:9.2f}MiB "
                      f"copies_per_engine={COPIES[path]} s_per_sync={seconds:6.2f} (first {first:5.2f})", flush=True)
        finally:
            for group in (actor, rollout):
                for rank in group._workers:
                    ray.kill(rank.worker, no_restart=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["tiny", "0.5b"], choices=sorted(QWEN2_SHAPES))
    ap.add_argument("--repeats", type=int, default=3, help="Timed syncs per path after one warm-up (median).")
    ap.add_argument("--bucket-mb", type=int, default=1024, help="Bucket size of the new routes (1 GiB by default).")
    ap.add_argument("--rollout-dtype", default="bfloat16", choices=["float32", "bfloat16"],
                    help="The engines' weights (the actor keeps fp32 master weights and sends this dtype).")
    args = ap.parse_args()
    from rlinf.scheduler import Cluster

    from rlinf_ext.assets.core.tiny import make_tiny_assets
    from rlinf_ext.runner.services import shutdown_ray

    tiny_root = Path(os.environ.get("RLINF_EXT_TINY_ASSETS") or Path(tempfile.gettempdir()) / "rlinf_ext_tiny_assets")
    make_tiny_assets(tiny_root, seed=0)
    os.environ.setdefault("RAY_ADDRESS", "local")  # a private Ray instance, never someone else's
    cluster = Cluster(num_nodes=1)
    try:
        for shape in args.shapes:
            bench(shape, args.repeats, args.bucket_mb << 20, args.rollout_dtype, tiny_root, cluster)
    finally:
        shutdown_ray()


if __name__ == "__main__":
    main()
