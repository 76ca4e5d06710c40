"""A rank of a test's spawned gloo world as the actor's data-parallel group (the env:// rendezvous variables
MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE must be set)."""

from __future__ import annotations

import torch.distributed as dist

from rlinf_ext.training.data_parallel import DataParallel


def init_gloo_dp() -> DataParallel:
    """The world group as this process's DP group."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return DataParallel(dist.get_rank(), dist.get_world_size(), dist.group.WORLD, dist.group.WORLD)
