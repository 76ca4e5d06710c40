"""CPU shims for Megatron-core and the gloo parallel-state helpers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlinf_ext.models import cpu_shims


def test_shims_are_idempotent_and_make_current_device_cpu():
    assert cpu_shims.cpu_mode()  # these tests run on CPU machines
    assert cpu_shims.apply_cpu_shims() is True
    assert cpu_shims.apply_cpu_shims() is True
    assert torch.cuda.current_device() == torch.device("cpu")
    from megatron.core.transformer import utils as mg_tutils

    assert torch.equal(
        mg_tutils.get_default_causal_mask(3),
        torch.tensor([[False, True, True], [False, False, True], [False, False, False]]),
    )


def test_rng_tracker_forks_cpu_state_and_restores_it():
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    cpu_shims.apply_cpu_shims()
    model_parallel_cuda_manual_seed(7, tp_rank=0, ep_rank=0, etp_rank=0, force_reset_rng=True)
    tracker = get_cuda_rng_tracker()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with tracker.fork():
        a = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before), "fork must restore the default CPU RNG state"
    with tracker.fork():
        b = torch.rand(4)
    assert not torch.equal(a, b), "the tracked state must advance between forks"
    # the model-parallel stream is seeded with seed + 2718 + tp_rank (Megatron's rule)
    expected = torch.Generator().manual_seed(7 + 2718)
    assert torch.equal(a, torch.rand(4, generator=expected))


@pytest.fixture
def no_process_group():
    """These tests create and tear down the process group themselves. An earlier test in the same worker may have
    left one: a MegatronPolicy keeps the process's group for its lifetime (one policy per worker process)."""
    cpu_shims.destroy_parallel_state()
    assert not dist.is_initialized()


@pytest.mark.usefixtures("no_process_group")
def test_parallel_state_world_size_one_and_teardown():
    from megatron.core import parallel_state

    with cpu_shims.parallel_state_session(1, 1) as setup:
        assert setup.created_process_group and setup.world_size == 1
        assert dist.get_backend() == "gloo"
        assert parallel_state.get_tensor_model_parallel_world_size() == 1
        assert parallel_state.get_pipeline_model_parallel_world_size() == 1
    assert not parallel_state.model_parallel_is_initialized()
    assert not dist.is_initialized()


@pytest.mark.usefixtures("no_process_group")
def test_parallel_state_rejects_world_size_not_multiple_of_tp_pp():
    with pytest.raises(ValueError, match="not a multiple of TP\\*PP"):
        cpu_shims.init_parallel_state(2, 1, world_size=3, init_method="tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="init_method"):
        cpu_shims.init_parallel_state(2, 1)
    assert not dist.is_initialized()
