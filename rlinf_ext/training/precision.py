"""Mixed precision of the CPU actor and the tensor-moving helpers of the offload.

Mixed precision on CPU (``actor.model.precision``; on CUDA Megatron's own optimizer does it, see
``training/optimizer.py``): the model's parameters stay fp32 and are what the optimizer steps (the fp32 master
copy); forward and backward run under ``torch.autocast`` in bf16/fp16, and fp16 losses go through a dynamic (or
static, ``actor.optim.loss_scale``) loss scaler. A 1e-6 update is far below bf16's resolution (~4e-3 relative), so
stepping bf16 weights directly would lose most updates.

Offload helpers (collocated GPU runs): ``move_module_`` moves parameters (in place, ``param.data``, so optimizer
references stay valid), gradients and buffers, e.g. the frozen reference model; ``move_optimizer_state_`` moves
optimizer moments; ``release_device_memory`` hands cached blocks back. NOT GPU-verified: on CPU these paths run with
``device=cpu``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from rlinf_ext.models.dtypes import PRECISIONS, autocast_dtype


class MixedPrecision:
    """fp32 master weights + autocast compute + (fp16 only) a loss scaler."""

    def __init__(self, precision: str, device: torch.device, loss_scale: float | None = None):
        if precision not in PRECISIONS:
            raise ValueError(f"actor.model.precision={precision!r}; use one of {PRECISIONS}.")
        self.precision = precision
        self.device_type = device.type
        self.compute_dtype = autocast_dtype(precision) or torch.float32
        self.static_scale = None if loss_scale is None else float(loss_scale)
        # bf16 has fp32's exponent range: no scaling needed (Megatron does the same)
        self.scaler = torch.amp.GradScaler(
            self.device_type,
            init_scale=self.static_scale or 2.0**16,
            enabled=precision == "fp16",
        )

    @property
    def mixed(self) -> bool:
        return self.precision != "fp32"

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for the model's forward (the backward replays the same casts); fp32: does nothing."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.compute_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale before clipping (no-op unless fp16)."""
        if self.scaler.is_enabled():
            self.scaler.unscale_(optimizer)

    def update(self) -> None:
        """After the (possibly skipped) step: grow/back off the dynamic scale, or keep the static one."""
        if self.scaler.is_enabled():
            self.scaler.update(new_scale=self.static_scale)

    def loss_scale(self) -> float:
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0


# ------------------------------------------------------------------------------------------ offload
def _move(t: torch.Tensor, device: torch.device, pin_memory: bool) -> torch.Tensor:
    """A copy of ``t`` on ``device`` (pinned when going to CPU with ``pin_memory``); values bit-equal."""
    if device.type == "cpu" and pin_memory:
        out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        out.copy_(t, non_blocking=True)
        return out
    return t.to(device, non_blocking=True, copy=True)


def move_module_(module: torch.nn.Module, device: torch.device, pin_memory: bool = False) -> None:
    """Move parameters (and their grads) and buffers in place; ``Parameter`` objects keep their identity."""
    for p in module.parameters():
        p.data = _move(p.data, device, pin_memory)
        if p.grad is not None:
            p.grad = _move(p.grad, device, pin_memory)
    for m in module.modules():
        for name, buf in m._buffers.items():
            if buf is not None:
                m._buffers[name] = _move(buf, device, pin_memory)


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[dict, str, torch.Tensor]]:
    for state in optimizer.state.values():
        for key, value in state.items():
            # the per-parameter moments; 0-dim ``step`` counters stay where torch keeps them (CPU unless
            # capturable), or AdamW would sync on every step
            if torch.is_tensor(value) and value.dim() > 0:
                yield state, key, value


def move_optimizer_state_(optimizer: torch.optim.Optimizer, device: torch.device, pin_memory: bool = False) -> int:
    """Move every non-scalar optimizer state tensor to ``device``; returns how many were moved. Stateless:
    state loaded while offloaded (``load_state_dict`` puts it next to the CPU parameters) moves back too."""
    moved = 0
    for state, key, value in list(_state_tensors(optimizer)):
        state[key] = _move(value, device, pin_memory)
        moved += 1
    return moved


def release_device_memory(device: torch.device) -> None:
    """Wait for pending copies and hand cached blocks back to the driver (so the rollout engine can use them)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
