"""Dynamic sampling through the real launcher: 3 steps of the tiny Search-R1 experiment with
``algorithm.adv_type=grpo_dynamic`` and ``algorithm.max_num_gen_batches=2`` on the HF engine (the quickest to start
on CPU), no validation, no evaluation. Every step logs ``dynamic/kept_groups``, ``dynamic/dropped_groups`` and
``dynamic/gen_batches``; the groups trained (``rollout/total_num_sequence`` / group size) are the kept ones plus
the padding; a step refills exactly when its first batch kept too few groups; the checkpoint's data position counts
every batch read, refills included. The model is tiny-cpu's own, the registry world's reader warm start (sampled
pass@1 ~0.15-0.4 on train questions), so groups of 4 come out mixed or all equal and some are kept; whether a step
refills is the sampler's draw, and each step is recounted from its dump either way (the driver tests,
tests/runner/test_trainer_dynamic.py, hand-compute each path)."""

from __future__ import annotations

import json

import pytest
import torch
from launch_helpers import CI_SIZE, launch, metrics_rows

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner.checkpoints import latest_complete_checkpoint
from rlinf_ext.runner.data_order import BATCHES_READ

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, BATCH, GROUP, N = 3, 2, 4, 2


def test_three_dynamic_sampling_steps_log_their_groups_and_count_their_refills_in_the_data_position(
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
        "runner.save_interval=-1",
        "rollout.rollout_backend=hf",
        "runner.val_before_train=false",
        "runner.val_check_interval=-1",
        f"runner.max_steps={STEPS}",
        "algorithm.adv_type=grpo_dynamic",
        f"algorithm.max_num_gen_batches={N}",
    ]
    code, log = launch(args, timeout=420)
    (tmp_path / "launch.log").write_text(log)
    assert code == 0, log[-3000:]
    rows = [r for r in metrics_rows(run_dir) if mk.DYNAMIC_GEN_BATCHES in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
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
    checkpoint = latest_complete_checkpoint(run_dir / "checkpoints")
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
