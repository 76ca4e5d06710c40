"""Gradient reduction and the optimizer step of one data-parallel rank of the Megatron-core actor.

Gradients go through Megatron-core's ``DistributedDataParallel``: one contiguous fp32 ``main_grad`` buffer, reduced
in place by ``finish_grad_sync``. The loss is already divided by the global loss-token count
(``training/data_parallel.py``), so the reduction must sum: ``calculate_per_token_loss=True`` sets DDP's scaling to
1, which ``wrap_ddp`` checks. CUDA, ``MegatronStep`` (NOT GPU-verified): ``get_megatron_optimizer`` (fp32 main
parameters, fp16 grad scaler, global-norm clipping, optional ``DistributedOptimizer``). CPU, ``TorchStep``:
Megatron's optimizers and grad scalers allocate CUDA tensors, so fp32 master parameters step with torch's AdamW
(``ZeroRedundancyOptimizer`` if ``use_distributed_optimizer`` and DP > 1) and ``torch.amp.GradScaler`` for fp16."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from torch.distributed.optim import ZeroRedundancyOptimizer

from rlinf_ext.training.data_parallel import DataParallel
from rlinf_ext.training.precision import MixedPrecision, move_module_, move_optimizer_state_
from rlinf_ext.training.settings import ActorSettings

# Megatron-LM's file for the distributed optimizer's gathered parameter state, beside model_optim_rng.pt
DISTRIB_OPTIM_FILE = "distrib_optim.pt"


@dataclass(frozen=True)
class StepResult:
    ok: bool  # False: a non-finite gradient (fp16 overflow) skipped the update
    grad_norm: float  # global norm before clipping (nan when the step was skipped on CUDA)
    loss_scale: float | None  # fp16 only


def wrap_ddp(model: torch.nn.Module, settings: ActorSettings, device: torch.device) -> DistributedDataParallel:
    """Megatron's DDP around ``model``: fp32 gradient buffer; reduce-scatter when the CUDA distributed
    optimizer shards the state, else all-reduce. Gradients are summed (see the module docstring)."""
    if not model.config.calculate_per_token_loss:
        raise ValueError(
            "the actor's TransformerConfig needs calculate_per_token_loss=True: its loss is divided by "
            "the global token count, so DDP must sum gradients instead of averaging them."
        )
    config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,  # 100+ micro-batches accumulate per step: 16-bit sums would lose them
        overlap_grad_reduce=False,
        use_distributed_optimizer=device.type == "cuda" and settings.use_distributed_optimizer,
    )
    return DistributedDataParallel(model.config, config, model)


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Megatron's rule: no weight decay on biases and norms (parameters with fewer than 2 dimensions)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for _, p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for _, p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def use_fused_adamw(optimizer: torch.optim.Optimizer) -> bool:
    """Switch a torch Adam/AdamW to its fused kernel before its first step (True if it was one).

    Megatron builds ``torch.optim.AdamW`` without ``fused`` when TE/apex are missing; torch reads ``fused`` and
    ``foreach`` per parameter group at every ``step`` and creates the state on first use, so switching now is
    the same as constructing it fused (the foreach path's ``sqrt`` temporaries are a full copy of the moments)."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) or optimizer.state:
        return False
    for group in [optimizer.defaults, *optimizer.param_groups]:
        group["fused"], group["foreach"] = True, False
    return True


class TorchStep:
    """CPU optimizer step: fp32 master parameters, torch AdamW/SGD (+ZeRO), torch GradScaler."""

    def __init__(self, ddp: DistributedDataParallel, settings: ActorSettings, dp: DataParallel, amp: MixedPrecision):
        self.ddp, self.settings, self.dp, self.amp = ddp, settings, dp, amp
        self.params = [p for p in ddp.module.parameters() if p.requires_grad]
        groups = decay_groups(ddp.module, settings.weight_decay)
        s = settings
        if s.optimizer == "adam":
            cls, kwargs = torch.optim.AdamW, dict(lr=s.lr, betas=(s.adam_beta1, s.adam_beta2), eps=s.adam_eps)
        elif s.optimizer == "sgd":
            cls, kwargs = torch.optim.SGD, dict(lr=s.lr)
        else:
            raise ValueError(f"actor.optim.optimizer={s.optimizer!r}; use 'adam' or 'sgd'.")
        if dp.enabled and s.use_distributed_optimizer:
            self.optimizer = ZeroRedundancyOptimizer(
                groups[0]["params"],
                optimizer_class=cls,
                process_group=dp.group,
                weight_decay=groups[0]["weight_decay"],
                **kwargs,
            )
            self.optimizer.add_param_group(groups[1])
        else:
            self.optimizer = cls(groups, **kwargs)

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.amp.scaler.scale(loss)

    def step(self, lr: float) -> StepResult:
        self.ddp.finish_grad_sync()  # before unscale: an overflow on any rank reaches every rank
        for p in self.params:
            p.grad = p.main_grad  # the reduced buffer, viewed: no copy
        try:
            self.amp.unscale_(self.optimizer)
            # clip_grad <= 0 = no clipping (Megatron's meaning); an infinite bound returns the norm only
            bound = self.settings.clip_grad if self.settings.clip_grad > 0 else math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, bound)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            ok = bool(torch.isfinite(grad_norm))
            if ok:  # as Megatron: a non-finite gradient skips the update instead of poisoning the weights
                self.optimizer.step()
            self.amp.update()  # fp16: an overflow halves the dynamic scale
        finally:
            for p in self.params:
                p.grad = None
        return StepResult(ok, float(grad_norm), self.amp.loss_scale() if self.amp.scaler.is_enabled() else None)

    def state_dict(self) -> dict[str, Any] | None:
        """torch's optimizer state (ZeRO: consolidated on rank 0, None elsewhere; collective), fp16 adds
        ``grad_scaler``. Call on every rank."""
        if isinstance(self.optimizer, ZeroRedundancyOptimizer):
            self.optimizer.consolidate_state_dict(to=0)
            if self.dp.rank != 0:
                return None
        state = self.optimizer.state_dict()
        if self.amp.scaler.is_enabled():
            state = {**state, "grad_scaler": self.amp.scaler.state_dict()}
        return state

    def load_state_dict(self, state: dict[str, Any], directory: Path | None = None) -> None:
        state = dict(state)
        scaler = state.pop("grad_scaler", None)
        self.optimizer.load_state_dict(state)  # ZeRO: every rank takes its part of the full state
        if scaler is not None and self.amp.scaler.is_enabled():
            self.amp.scaler.load_state_dict(scaler)

    def save_extra(self, directory: Path) -> None:
        """Nothing beside the rank file (the torch state fits in it)."""

    def offload(self, optimizer: bool, grads: bool) -> None:
        """No-op: the CPU actor has no GPU to free."""

    def onload(self) -> None:
        """No-op (see ``offload``)."""


class MegatronStep:
    """CUDA optimizer step through Megatron-core's optimizer (written, NOT GPU-verified)."""

    def __init__(self, ddp: DistributedDataParallel, settings: ActorSettings, params_dtype: torch.dtype):
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        s = settings
        self.ddp, self.settings = ddp, s
        self.fp16 = params_dtype == torch.float16
        self.sharded = s.use_distributed_optimizer
        if self.sharded and s.optimizer != "adam":
            raise ValueError(
                "actor.optim.use_distributed_optimizer=true supports actor.optim.optimizer=adam only "
                "(Megatron's DistributedOptimizer); set use_distributed_optimizer=false for sgd."
            )
        config = OptimizerConfig(
            optimizer=s.optimizer,
            lr=s.lr,
            min_lr=s.min_lr,
            weight_decay=s.weight_decay,
            adam_beta1=s.adam_beta1,
            adam_beta2=s.adam_beta2,
            adam_eps=s.adam_eps,
            sgd_momentum=0.0,
            clip_grad=s.clip_grad,
            bf16=params_dtype == torch.bfloat16,
            fp16=self.fp16,
            params_dtype=params_dtype,
            loss_scale=s.loss_scale,
            initial_loss_scale=2.0**16,
            use_distributed_optimizer=self.sharded,
        )
        self.optimizer = get_megatron_optimizer(config, [ddp])
        self.fused = any(use_fused_adamw(o.optimizer) for o in self.optimizer.chained_optimizers)
        # fp32 main parameters separate from the model's (16-bit) ones: Megatron's offload moves them with the
        # moments; with fp32 parameters they ARE the model's (views of its buffer) and move with the weights
        self.main_params_are_copies = params_dtype != torch.float32
        self._offloaded = False

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.optimizer.scale_loss(loss)

    def step(self, lr: float) -> StepResult:
        self.ddp.finish_grad_sync()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        ok, grad_norm, _ = self.optimizer.step()  # unscale + inf check, clip, step, all-gather (sharded)
        scale = float(self.optimizer.get_loss_scale()) if self.fp16 else None
        return StepResult(bool(ok), math.nan if grad_norm is None else float(grad_norm), scale)

    def state_dict(self) -> dict[str, Any]:
        """Megatron's optimizer state dict (param groups, grad scaler; the non-sharded optimizer also its
        state and fp32 main parameters). The sharded state goes to ``save_extra``."""
        return self.optimizer.state_dict()

    def save_extra(self, directory: Path) -> None:
        """The distributed optimizer's parameter state gathered on DP rank 0 (collective: call on every rank)."""
        if self.sharded:
            self.optimizer.save_parameter_state(str(Path(directory) / DISTRIB_OPTIM_FILE))

    def load_state_dict(self, state: dict[str, Any], directory: Path | None = None) -> None:
        self.optimizer.load_state_dict(state)
        if self.sharded:
            if directory is None or not (Path(directory) / DISTRIB_OPTIM_FILE).is_file():
                raise FileNotFoundError(
                    f"{directory}: no {DISTRIB_OPTIM_FILE}; a checkpoint of the distributed "
                    "optimizer needs it (resume with the same actor.optim.use_distributed_optimizer)"
                )
            load_parameter_state_keeping_steps(self.optimizer, Path(directory) / DISTRIB_OPTIM_FILE)

    def offload(self, optimizer: bool, grads: bool) -> None:
        """Megatron's own RL offload: optimizer state (``offload_to_cpu``) and the gradient buffer's storage."""
        if optimizer and not self._offloaded:
            if self.main_params_are_copies:
                self.optimizer.offload_to_cpu()
            else:
                for inner in self.optimizer.chained_optimizers:
                    move_optimizer_state_(inner.optimizer, torch.device("cpu"), pin_memory=True)
            self._offloaded = True
        if grads:
            self.ddp.offload_grad_buffers(synchronize=False, empty_cache=False)

    def onload(self) -> None:
        if self._offloaded:
            if self.main_params_are_copies:
                self.optimizer.restore_from_cpu()
            else:
                device = torch.device("cuda", torch.cuda.current_device())
                for inner in self.optimizer.chained_optimizers:
                    move_optimizer_state_(inner.optimizer, device)
            self._offloaded = False
        self.ddp.restore_grad_buffers(synchronize=False)  # no-op unless offloaded


def load_parameter_state_keeping_steps(optimizer: Any, path: Path) -> None:
    """Megatron's ``load_parameter_state`` with torch's per-parameter ``step`` set aside.

    Megatron-core 0.16.1 (``distrib_optimizer.py:_set_main_param_and_optimizer_states``) copies every state key
    from the file (param / exp_avg / exp_avg_sq only), so torch's AdamW (Megatron's without TE or Apex) raised
    ``KeyError: 'step'`` on its per-parameter ``step``, already restored by ``load_state_dict``. TE's FusedAdam
    keeps the step per group: nothing to set aside there."""
    held = [
        (state, state.pop("step"))
        for inner in optimizer.chained_optimizers
        for state in inner.optimizer.state.values()
        if "step" in state
    ]
    try:
        optimizer.load_parameter_state(str(path))
    finally:
        for state, step in held:
            state["step"] = step


def offload_weights(ddp: DistributedDataParallel, to_cpu: bool, device: torch.device) -> None:
    """Move the policy's weights off / back onto the GPU. Parameters living in DDP's parameter buffer
    (distributed optimizer) move with the buffer (Megatron's ``offload_to_cpu`` / ``reload_from_cpu``: the
    optimizer's shard views stay valid); others move in place (``precision.move_module_``)."""
    in_buffer = [b for b in ddp.buffers if b.param_data is not None]
    for buffer in in_buffer:
        if to_cpu:
            buffer.offload_to_cpu(move_params=True, move_grads=False)
        else:
            buffer.reload_from_cpu(move_params=True, move_grads=False)
    if not in_buffer:
        move_module_(ddp.module, torch.device("cpu") if to_cpu else device, pin_memory=to_cpu)


def build_step(
    ddp: DistributedDataParallel,
    settings: ActorSettings,
    dp: DataParallel,
    amp: MixedPrecision,
    device: torch.device,
    params_dtype: torch.dtype,
) -> TorchStep | MegatronStep:
    if device.type == "cuda":
        return MegatronStep(ddp, settings, params_dtype)
    return TorchStep(ddp, settings, dp, amp)
