"""The one place that makes Megatron-core 0.16.1 run on CPU, plus parallel-state set-up on gloo.

Megatron-core assumes CUDA in a few spots that a forward/backward pass on CPU hits (gloo itself
supports the collectives TP needs in torch 2.13, so those are left alone):

* ``torch.cuda.current_device()`` is used as a ``device=`` argument (rotary embeddings, TP buffers);
  on CPU it should name the CPU.
* the CUDA RNG tracker (``tensor_parallel.random``) stores and swaps CUDA generator states around
  dropout and weight init; on CPU it must swap the CPU generator state instead. Activation recompute
  (``tensor_parallel.checkpoint``, ``actor.model.recompute_*``) saves and restores the CUDA generator around
  the recomputed forward; on CPU only the CPU generator (saved beside it) exists.
* ``transformer.utils.get_default_causal_mask`` builds its mask with ``device="cuda"``.
* the tensor-parallel linear autograd functions are decorated with ``custom_fwd/custom_bwd`` for CUDA
  autocast only, so under CPU autocast (the actor's bf16/fp16 mixed precision) their backward would mix a
  bf16 gradient with an fp32 weight; they are re-decorated for CPU autocast.

``apply_cpu_shims()`` patches exactly these, is idempotent, and does nothing when CUDA is available.
The actor and the converter's ``--verify`` share it; nothing else in the repo may patch Megatron.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import inspect
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

_APPLIED = False


def cpu_mode() -> bool:
    """True when Megatron must run on CPU (no usable CUDA device)."""
    return not torch.cuda.is_available()


def _cpu_current_device() -> torch.device:
    return torch.device("cpu")


def _make_cpu_rng_tracker_class(random_mod):
    base = random_mod.CudaRNGStatesTracker
    if getattr(base, "_rlinf_ext_cpu", False):
        return base

    class CpuRNGStatesTracker(base):  # type: ignore[misc, valid-type]
        """Megatron's RNG tracker keyed on the CPU generator (same names, seeds and fork semantics)."""

        _rlinf_ext_cpu = True

        def __init__(self, *args, **kwargs):
            kwargs.pop("use_cudagraphable_rng", None)
            kwargs.pop("is_inference_rng_tracker", None)
            super().__init__(use_cudagraphable_rng=False)

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            gen = torch.Generator(device="cpu")
            gen.manual_seed(seed)
            self.states_[name] = gen.get_state()

        @contextlib.contextmanager
        def fork(self, name=random_mod._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            orig_state = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(orig_state)

    return CpuRNGStatesTracker


def apply_cpu_shims() -> bool:
    """Patch Megatron-core for CPU execution. Idempotent; returns True if the shims are active.

    Does nothing (returns False) when CUDA is available.
    """
    global _APPLIED
    if _APPLIED:
        return True
    if not cpu_mode():
        return False

    torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]

    from megatron.core.tensor_parallel import random as mg_random

    cpu_tracker_cls = _make_cpu_rng_tracker_class(mg_random)
    mg_random.CudaRNGStatesTracker = cpu_tracker_cls
    # recompute: nothing to save or restore for a CUDA generator that does not exist
    mg_random._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    mg_random._set_cuda_rng_state = lambda *args, **kwargs: None
    # A tracker created before the patch would still swap CUDA states: drop it so the next
    # get_cuda_rng_tracker() builds a CPU one.
    if mg_random._CUDA_RNG_STATE_TRACKER is not None and not isinstance(
        mg_random._CUDA_RNG_STATE_TRACKER, cpu_tracker_cls
    ):
        mg_random._CUDA_RNG_STATE_TRACKER = None
        mg_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = False
    # torch.cuda.manual_seed is lazy on CPU builds (queued, never run) and therefore harmless.

    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils as mg_tutils

    @functools.lru_cache(maxsize=16)
    def _cpu_default_causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    mg_tutils.get_default_causal_mask = _cpu_default_causal_mask
    fused_softmax.get_default_causal_mask = _cpu_default_causal_mask

    from megatron.core.tensor_parallel import layers as mg_layers

    for fn in (mg_layers.LinearWithGradAccumulationAndAsyncCommunication, mg_layers.LinearWithFrozenWeight):
        # backward re-enters the forward's CPU autocast state (as custom_bwd does for CUDA on GPU)
        fn.forward = staticmethod(torch.amp.custom_fwd(inspect.unwrap(fn.forward), device_type="cpu"))
        fn.backward = staticmethod(torch.amp.custom_bwd(inspect.unwrap(fn.backward), device_type="cpu"))

    _APPLIED = True
    return True


# --------------------------------------------------------------------------- parallel state


@dataclass(frozen=True)
class ParallelSetup:
    """What `init_parallel_state` did, so `destroy_parallel_state` undoes exactly that."""

    tp: int
    pp: int
    rank: int
    world_size: int
    created_process_group: bool


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for the gloo rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_parallel_state(
    tp: int = 1,
    pp: int = 1,
    *,
    rank: int = 0,
    world_size: int | None = None,
    init_method: str | None = None,
    seed: int = 1234,
    timeout_s: float = 300.0,
) -> ParallelSetup:
    """Initialise torch.distributed (gloo on CPU, nccl on GPU) and ``megatron.core.parallel_state``.

    World size 1 (in-process) needs nothing else; for several processes pass the same
    ``init_method`` (``tcp://127.0.0.1:PORT`` or ``file://...``) and each process's ``rank``.
    An already initialised default process group is reused (and left alone by the teardown).
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    apply_cpu_shims()
    world_size = tp * pp if world_size is None else world_size
    if world_size % (tp * pp) != 0:
        raise ValueError(f"world size {world_size} is not a multiple of TP*PP = {tp}*{pp}; start TP*PP*DP processes.")
    created = False
    if not dist.is_initialized():
        if init_method is None:
            if world_size != 1:
                raise ValueError("init_method (tcp://HOST:PORT or file://PATH) is required for world_size > 1")
            init_method = f"tcp://127.0.0.1:{free_port()}"
        backend = "gloo" if cpu_mode() else "nccl"
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        created = True
    elif dist.get_world_size() % (tp * pp) != 0:
        raise ValueError(f"existing process group of size {dist.get_world_size()} cannot hold TP*PP = {tp}*{pp}")

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        create_gloo_process_groups=not cpu_mode(),  # on CPU the default groups are gloo already
        distributed_timeout_minutes=max(1, round(timeout_s / 60)),
    )
    model_parallel_cuda_manual_seed(seed)
    return ParallelSetup(tp, pp, dist.get_rank(), dist.get_world_size(), created)


def destroy_parallel_state(setup: ParallelSetup | None = None) -> None:
    """Tear down ``parallel_state`` and, if `init_parallel_state` created it, the process group."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized() and (setup is None or setup.created_process_group):
        dist.destroy_process_group()


@contextlib.contextmanager
def parallel_state_session(tp: int = 1, pp: int = 1, **kwargs):
    """``with parallel_state_session(tp, pp, rank=.., init_method=..) as setup:`` — init then teardown."""
    setup = init_parallel_state(tp, pp, **kwargs)
    try:
        yield setup
    finally:
        destroy_parallel_state(setup)


def env_init_method() -> str | None:
    """``tcp://MASTER_ADDR:MASTER_PORT`` when the usual launcher variables are set, else None."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"tcp://{addr}:{port}" if addr and port else None
