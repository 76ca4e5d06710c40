"""The training batches' order: a pure function of the data position, so a resume reads exactly what the
uninterrupted run would have read next.

Batch ``i`` of a run (counted over all epochs) is slice ``i mod E`` of epoch ``i // E``'s order (``E``: whole batches
per epoch, the last partial batch dropped). An epoch's order is torch's ``DistributedSampler`` order on one replica
with ``set_epoch(epoch)``: a permutation seeded by ``data.seed + epoch`` (epoch 0 is the order a ``RandomSampler``
seeded with ``data.seed`` gives), or the file order without ``data.shuffle``. A checkpoint therefore stores one
integer, the batches read (``DataPosition``), and no generator state: the position after an epoch's last batch is
the start of the next epoch, never an "exhausted" loader. Under group admission (``runner.admission: group``) some
prompts of the batches read are still untrained at a checkpoint: it also stores them, as (batch, slot) pairs
(``IN_FLIGHT``), which a resume dispatches again before reading on.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.utils.data import DistributedSampler

BATCHES_READ = "batches_read"  # data/data.pt: the batches of the run read so far
ORDER = "order"  # data/data.pt: the BatchOrder they were read in (checked on resume)
IN_FLIGHT = "in_flight"  # data/data.pt: [batch, slot] of each prompt read and not trained yet (group admission)


@dataclass(frozen=True)
class BatchOrder:
    """Which dataset indices each batch of a run holds."""

    dataset_len: int
    batch_size: int
    seed: int
    shuffle: bool
    max_epochs: int

    @property
    def batches_per_epoch(self) -> int:
        return self.dataset_len // self.batch_size

    @property
    def total_batches(self) -> int:
        return self.batches_per_epoch * self.max_epochs

    def epoch_indices(self, epoch: int) -> list[int]:
        """The dataset indices in epoch ``epoch``'s order (all of them, before the last partial batch is dropped)."""
        sampler = DistributedSampler(
            range(self.dataset_len), num_replicas=1, rank=0, shuffle=self.shuffle, seed=self.seed
        )
        sampler.set_epoch(epoch)
        return list(sampler)

    def batch_indices(self, batch: int) -> list[int]:
        """The dataset indices of batch ``batch`` of the run."""
        epoch, slot = divmod(batch, self.batches_per_epoch)
        return self.epoch_indices(epoch)[slot * self.batch_size : (slot + 1) * self.batch_size]

    def batches(self, dataset: Sequence, start: int) -> Iterator[tuple[int, list]]:
        """``(batch, items)`` from batch ``start`` to the run's last one (each epoch's order computed once)."""
        epoch, order = -1, []
        for batch in range(start, self.total_batches):
            if batch // self.batches_per_epoch != epoch:
                epoch = batch // self.batches_per_epoch
                order = self.epoch_indices(epoch)
            slot = batch % self.batches_per_epoch
            yield batch, [dataset[i] for i in order[slot * self.batch_size : (slot + 1) * self.batch_size]]

    def state(self, batches_read: int, in_flight: Sequence[Sequence[int]] = ()) -> dict:
        """What ``data/data.pt`` holds after ``batches_read`` batches, ``in_flight`` of their prompts untrained
        (the key only when some are: a batch-admission checkpoint stays as it was)."""
        state = {BATCHES_READ: batches_read, ORDER: {k: v for k, v in asdict(self).items() if k != "max_epochs"}}
        if in_flight:
            state[IN_FLIGHT] = [[int(b), int(slot)] for b, slot in in_flight]
        return state

    def position_of(self, state: dict, trained_steps: int, where: Path) -> int:
        """The batches read of a checkpoint's ``data/data.pt`` (``where``), refused when its order is not this
        run's: the same position would then name other prompts."""
        if BATCHES_READ not in state:  # a torchdata StatefulDataLoader state, before this module
            warnings.warn(
                f"{where} holds a data-loader state of an older format: resuming at batch {trained_steps} "
                "(one batch per trained step); epochs after the first follow this version's order",
                RuntimeWarning,
            )
            return trained_steps
        saved, ours = state[ORDER], self.state(0)[ORDER]
        changed = {k: (saved.get(k), v) for k, v in ours.items() if saved.get(k) != v}
        if changed:
            detail = ", ".join(f"{k}: {old} then, {new} now" for k, (old, new) in changed.items())
            raise ValueError(
                f"{where} was written for another data order ({detail}); the same position would train "
                "other prompts. Resume with the settings and training set of that run, or start a new "
                "run (runner.resume_dir=null, another runner.experiment_name)."
            )
        return int(state[BATCHES_READ])


def batch_order(cfg, dataset_len: int) -> BatchOrder:
    """The run's order from its config (``data.rollout_batch_size``, ``data.seed``, ``data.shuffle``,
    ``runner.max_epochs``)."""
    return BatchOrder(
        dataset_len=dataset_len,
        batch_size=int(cfg.data.rollout_batch_size),
        seed=int(cfg.data.seed),
        shuffle=bool(cfg.data.shuffle),
        max_epochs=int(cfg.runner.max_epochs),
    )


def save_position(order: BatchOrder, batches_read: int, path: Path, in_flight: Sequence[Sequence[int]] = ()) -> None:
    torch.save(order.state(batches_read, in_flight), path)


def load_position(order: BatchOrder, path: Path, trained_steps: int) -> int:
    return order.position_of(torch.load(path, weights_only=True), trained_steps, path)


def load_in_flight(path: Path) -> list[list[int]]:
    """The (batch, slot) of the prompts a checkpoint's ``data/data.pt`` holds in flight (none before group
    admission)."""
    return [list(pair) for pair in torch.load(path, weights_only=True).get(IN_FLIGHT, [])]
