"""``torch.multiprocessing.spawn`` for the tests' gloo ranks, each rank ending with ``os._exit`` once its function
returned: a spawned rank otherwise tears its interpreter down at exit (torch, Megatron, transformers: ~1 CPU-s a
rank). A rank's failure goes to torch's error queue as before, and the parent raises it."""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable


def _run_then_exit(fn: Callable, rank: int, *args) -> None:
    fn(rank, *args)  # what it writes for the parent is closed when it returns
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_ranks(fn: Callable, args: tuple, nprocs: int) -> None:
    """``fn(rank, *args)`` in ``nprocs`` spawned processes; returns when all ended, raises the first failure."""
    import torch.multiprocessing as mp

    mp.spawn(functools.partial(_run_then_exit, fn), args=args, nprocs=nprocs, join=True)
