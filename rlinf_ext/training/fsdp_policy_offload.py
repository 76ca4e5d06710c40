"""Offloading the FSDP2 actor between phases, so a collocated rollout engine can use its GPUs (``actor.offload_*``).

FSDP2's own means, as verl offloads its FSDP2 actor: the module is moved with ``nn.Module._apply`` (what
``.to()``/``.cpu()`` call). ``FSDPModule._apply`` (torch/distributed/fsdp/_fully_shard/_fully_shard.py) reshards
first, so only the sharded DTensor parameters are registered, and afterwards re-registers each new local shard
with its ``FSDPParam`` (``reset_sharded_param``), so the next all-gather reads the moved shard. DTensor parameters
are swapped in place (``torch.utils.swap_tensors``), so the ``Parameter`` objects the optimizer keys its state by
keep their identity. The copy is explicit (``copy=True``): ``.to()`` skips a move to the device a tensor is
already on, and on a CPU actor (the tests) that would leave nothing to check. The optimizer state (AdamW's
moments, DTensors like their parameters) moves tensor by tensor (``precision.move_optimizer_state_``, not pinned:
a pinned buffer cannot hold a DTensor). Gradients are freed (``zero_grad(set_to_none=True)``), not moved: every
mini-batch starts from zero gradients, so nothing reads them after the optimizer step.

CPU-tested (one process and two gloo ranks: state bit-exact after a round trip, a training step after it equal to
one without); the CUDA path is the same code with ``device`` a GPU and is NOT GPU-verified.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from rlinf_ext.training.precision import move_optimizer_state_, release_device_memory

OFFLOAD_DEVICE = torch.device("cpu")


def move_module_copy_(module: torch.nn.Module, device: torch.device) -> None:
    """Every parameter (sharded DTensor under FSDP2, with its gradient) and buffer of `module` copied onto
    `device` in place (module docstring)."""
    module._apply(lambda t: t.to(device, copy=True))


@dataclass
class OffloadState:
    """What is off the device now."""

    weights: bool = False
    optimizer: bool = False


class FSDPOffload:
    """Offload / onload of one FSDP2 policy: its model, the frozen reference, the optimizer state, the gradients."""

    def __init__(
        self,
        model: torch.nn.Module,
        ref_model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
    ):
        self.model, self.ref_model, self.optimizer, self.device = model, ref_model, optimizer, device
        self.state = OffloadState()

    @property
    def offloaded(self) -> bool:
        return self.state.weights or self.state.optimizer

    def _move_weights(self, device: torch.device) -> None:
        for module in (self.model, self.ref_model):
            if module is not None:
                move_module_copy_(module, device)

    def offload(self, weights: bool, optimizer: bool, grads: bool) -> None:
        if grads:  # before moving the weights: freed gradients are not copied
            self.optimizer.zero_grad(set_to_none=True)
        if weights and not self.state.weights:
            self._move_weights(OFFLOAD_DEVICE)
            self.state.weights = True
        if optimizer and not self.state.optimizer:
            move_optimizer_state_(self.optimizer, OFFLOAD_DEVICE)
            self.state.optimizer = True
        release_device_memory(self.device)

    def onload(self) -> None:
        if self.state.weights:
            self._move_weights(self.device)
            self.state.weights = False
        if self.state.optimizer:
            move_optimizer_state_(self.optimizer, self.device)
            self.state.optimizer = False

    @contextlib.contextmanager
    def on_device(self, optimizer: bool = True) -> Iterator[None]:
        """The weights (and the optimizer state with `optimizer`) on the device for one call: the FSDP2 gathers of
        a weight sync or a checkpoint are collective and run on the device's process group. What this brought
        is offloaded again afterwards; nested calls bring nothing twice."""
        moved = OffloadState(self.state.weights, optimizer and self.state.optimizer)
        if moved.weights:
            self._move_weights(self.device)
            self.state.weights = False
        if moved.optimizer:
            move_optimizer_state_(self.optimizer, self.device)
            self.state.optimizer = False
        try:
            yield
        finally:
            if moved.weights or moved.optimizer:
                self.offload(weights=moved.weights, optimizer=moved.optimizer, grads=False)
