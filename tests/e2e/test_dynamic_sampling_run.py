"""Dynamic sampling through the real launcher, stopped with Ctrl-C: the tiny Search-R1 experiment with
``algorithm.adv_type=grpo_dynamic`` and ``algorithm.max_num_gen_batches=2`` on the HF engine (the quickest to start
on CPU), no validation, no evaluation, a checkpoint every step; SIGINT once step 3 is logged (one launch for both:
a launch costs ~45 CPU-s of start-up).

Ctrl-C: the launcher stops the worker groups, the retrieval server and the Ray instance it started, and exits 130;
no process it started survives. Dynamic sampling, in the steps before it: every step logs ``dynamic/kept_groups``,
``dynamic/dropped_groups`` and ``dynamic/gen_batches``; the groups trained (``rollout/total_num_sequence`` / group size) are the kept ones plus
the padding; a step refills exactly when its first batch kept too few groups; the checkpoint's data position counts
every batch read, refills included. The model is tiny-cpu's own, the registry world's reader warm start (sampled
pass@1 ~0.15-0.4 on train questions), so groups of 4 come out mixed or all equal and some are kept; whether a step
refills is the sampler's draw, and each step is recounted from its dump either way (the driver tests,
tests/runner/test_trainer_dynamic.py, hand-compute each path)."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest
import torch
from launch_helpers import CI_SIZE, launch, metrics_rows, when_step_logged

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner.checkpoints import latest_complete_checkpoint
from rlinf_ext.runner.data_order import BATCHES_READ

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, BATCH, GROUP, N = 3, 2, 4, 2
MAX_STEPS = STEPS + 2  # Ctrl-C lands in step 4, a step from the run's end


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_dynamic_sampling_steps_log_their_groups_count_their_refills_and_ctrl_c_stops_every_process(
    tiny_assets_registry, tmp_path
):
    run_dir = tmp_path / "searchr1-grpo-tiny-cpu"
    args = [
        "--no-eval",
        f"paths.tiny_assets={tiny_assets_registry.root}",
        f"runner.output_dir={tmp_path}",
        f"runner.rollout_data_dir={tmp_path / 'dumps'}",
        *[a for a in CI_SIZE if not a.startswith(("runner.save_interval=", "algorithm.group_size="))],
        f"algorithm.group_size={GROUP}",
        "runner.save_interval=1",
        "rollout.rollout_backend=hf",
        "runner.val_before_train=false",
        "runner.val_check_interval=-1",
        f"runner.max_steps={MAX_STEPS}",
        "algorithm.adv_type=grpo_dynamic",
        f"algorithm.max_num_gen_batches={N}",
    ]
    launcher: dict = {}
    seen: set[int] = set()  # every process the launcher started, as step 3 is logged

    def keep_proc(_line, proc):
        launcher["proc"] = proc

    def ctrl_c():  # once step 3's trajectories are on disk too (the sink writes them after its metrics row)
        while not (tmp_path / "dumps" / f"step_{STEPS}.jsonl").exists():
            time.sleep(0.05)
        seen.update(p.pid for p in psutil.Process(launcher["proc"].pid).children(recursive=True))
        launcher["proc"].send_signal(signal.SIGINT)

    watch = when_step_logged(run_dir, STEPS, ctrl_c)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    try:
        code, log = launch(args, on_line=keep_proc, timeout=420, env=env)
    finally:
        watch.finish()
    (tmp_path / "launch.log").write_text(log)
    assert code == 130, log[-12000:]
    assert "SIGINT received" in log and "interrupted" in log
    assert len(seen) >= 4, "expected the retrieval server, Ray and worker processes"
    deadline = time.time() + 60
    alive = seen
    while time.time() < deadline:
        alive = {pid for pid in seen if running(pid)}
        if not alive:
            break
        time.sleep(1)
    assert not alive, f"processes left running after Ctrl-C: {sorted(alive)}"

    # step 3's checkpoint is the last: Ctrl-C came while step 4 rolled out
    checkpoint = latest_complete_checkpoint(run_dir / "checkpoints")
    assert checkpoint == run_dir / "checkpoints" / f"global_step_{STEPS}", checkpoint
    rows = [r for r in metrics_rows(run_dir) if mk.DYNAMIC_GEN_BATCHES in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), log[-4000:]
    for row in rows:
        # the step's dump holds every group it generated, with the rewards: recount from it, batch by batch
        dump = [
            json.loads(line) for line in (tmp_path / "dumps" / f"step_{row['step']}.jsonl").read_text().splitlines()
        ]
        groups: dict[str, dict[str, list[float]]] = {}  # batch label s<b>[r<r>] -> group uid -> rewards
        for rec in dump:
            groups.setdefault(rec["uid"].split("-")[0], {}).setdefault(rec["uid"], []).append(rec["reward"])
        mixed = [sum(len(set(r)) > 1 for r in batch.values()) for batch in groups.values()]
        all_equal = sum(len(set(r)) == 1 for batch in groups.values() for r in batch.values())
        kept = min(sum(mixed), BATCH)
        assert row[mk.DYNAMIC_GEN_BATCHES] == len(groups) == (1 if mixed[0] >= BATCH else N), (row, groups)
        assert (row[mk.DYNAMIC_KEPT_GROUPS], row[mk.DYNAMIC_DROPPED_GROUPS]) == (kept, all_equal), (row, groups)
        padded = 0 if kept else 1  # a share unit is one group here (one actor rank, one minibatch)
        assert row[mk.DYNAMIC_PADDED_GROUPS] == padded
        assert row["rollout/total_num_sequence"] == (kept + padded) * GROUP, row
    assert sum(r[mk.DYNAMIC_KEPT_GROUPS] for r in rows) > 0, rows  # the keeping path ran through the launcher
    position = torch.load(checkpoint / "data" / "data.pt")[BATCHES_READ]
    assert position == sum(r[mk.DYNAMIC_GEN_BATCHES] for r in rows)
    print(
        "dynamic metrics per step:",
        [
            (
                r[mk.DYNAMIC_KEPT_GROUPS],
                r[mk.DYNAMIC_DROPPED_GROUPS],
                r[mk.DYNAMIC_GEN_BATCHES],
                r[mk.DYNAMIC_PADDED_GROUPS],
            )
            for r in rows
        ],
    )
