"""Offload/onload helpers of the actor (the device-independent part, on CPU): moving a module or an optimizer's
state keeps values bit-equal and Parameter identity, leaves the scalar step counters alone, and training
continues exactly as without the round trip. The CPU actor's offload_engine/onload_engine are no-ops."""

import copy

import pytest
import torch

from rlinf_ext.training.precision import move_module_, move_optimizer_state_, release_device_memory

CPU = torch.device("cpu")


def _model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    model.register_buffer("scale", torch.tensor([2.0, 3.0]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    return model, opt


def _step(model, opt, seed):
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
    opt.zero_grad(set_to_none=True)
    (model(x).square().mean() * model.scale.sum()).backward()
    opt.step()


def test_optimizer_state_round_trip_is_bit_equal_and_training_continues_identically():
    model, opt = _model_and_optimizer()
    _step(model, opt, 0)
    twin_model = copy.deepcopy(model)  # the control: same state, never moved
    twin_opt = torch.optim.AdamW(twin_model.parameters(), lr=1e-2, weight_decay=0.01)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict alone would share tensors

    before = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    old_storage = {id(p): s["exp_avg"].data_ptr() for p, s in opt.state.items()}
    steps = {id(p): s["step"] for p, s in opt.state.items()}
    params = list(model.parameters())
    moved = move_optimizer_state_(opt, CPU)
    assert moved == 2 * len(params)  # exp_avg + exp_avg_sq per parameter; not the step counters
    for p, s in opt.state.items():
        assert s["step"] is steps[id(p)]  # untouched
        assert s["exp_avg"].data_ptr() != old_storage[id(p)]  # really copied
        for k, v in s.items():
            assert torch.equal(v, before[id(p)][k]) and v.dtype == before[id(p)][k].dtype
    move_module_(model, CPU)
    assert list(model.parameters()) == params  # same Parameter objects: the optimizer still holds them
    move_optimizer_state_(opt, CPU)
    release_device_memory(CPU)  # no-op on CPU

    for seed in (1, 2):
        _step(model, opt, seed)
        _step(twin_model, twin_opt, seed)
    for a, b in zip(model.parameters(), twin_model.parameters()):
        assert torch.equal(a, b)


def test_module_round_trip_moves_params_grads_and_buffers():
    model, opt = _model_and_optimizer()
    _step(model, opt, 0)
    weights = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    ptrs = [p.data_ptr() for p in model.parameters()]
    buf_ptr = model.scale.data_ptr()
    move_module_(model, CPU)
    for p, w, g, ptr in zip(model.parameters(), weights, grads, ptrs):
        assert isinstance(p, torch.nn.Parameter) and p.requires_grad
        assert p.data_ptr() != ptr and torch.equal(p, w) and torch.equal(p.grad, g)
    assert model.scale.data_ptr() != buf_ptr and torch.equal(model.scale, torch.tensor([2.0, 3.0]))


@pytest.mark.timeout(300)
def test_cpu_policy_offload_is_a_no_op(tiny_assets):
    from rlinf_ext.training.megatron_policy import MegatronPolicy
    from rlinf_ext.training.settings import ActorSettings

    policy = MegatronPolicy(tiny_assets.qwen2_tiny, ActorSettings(group_size=2))
    ptrs = [p.data_ptr() for p in policy.model.parameters()]
    policy.offload()
    assert not policy.offloaded and [p.data_ptr() for p in policy.model.parameters()] == ptrs
    policy.onload()
    assert [p.data_ptr() for p in policy.model.parameters()] == ptrs


@pytest.mark.timeout(300)
def test_policy_offload_bookkeeping_as_on_cuda(tiny_assets, monkeypatch):
    """What a CUDA actor would move, recorded instead of done (no GPU here): the policy's weights (through DDP's
    buffers when they hold them, training/optimizer.py:offload_weights), the reference's weights (pinned), then
    the optimizer step object's state and gradients as actor.offload_optimizer / offload_grad say; idempotent;
    onload restores exactly what was offloaded."""
    from rlinf_ext.training import megatron_policy as actor_mod
    from rlinf_ext.training.megatron_policy import MegatronPolicy
    from rlinf_ext.training.rl_math import LossConfig
    from rlinf_ext.training.settings import ActorSettings

    settings = ActorSettings(
        group_size=2, loss=LossConfig(kl_beta=0.1), offload_weight=True, offload_optimizer=False, offload_grad=True
    )
    policy = MegatronPolicy(tiny_assets.qwen2_tiny, settings)
    calls = []
    monkeypatch.setattr(
        actor_mod,
        "offload_weights",
        lambda ddp, to_cpu, device: calls.append(("policy", "cpu" if to_cpu else device.type)),
    )
    monkeypatch.setattr(
        actor_mod, "move_module_", lambda m, d, pin_memory=False: calls.append(("reference", d.type, pin_memory))
    )
    monkeypatch.setattr(actor_mod, "release_device_memory", lambda d: calls.append(("release", d.type)))
    monkeypatch.setattr(policy.step, "offload", lambda optimizer, grads: calls.append(("step", optimizer, grads)))
    monkeypatch.setattr(policy.step, "onload", lambda: calls.append(("step-onload",)))
    policy.device = torch.device("cuda", 0)

    policy.offload()  # the settings' flags
    assert calls == [("policy", "cpu"), ("reference", "cpu", True), ("step", False, True), ("release", "cuda")]
    calls.clear()
    policy.offload(optimizer=True)  # weights already off: only the step object is asked again
    assert calls == [("step", True, True), ("release", "cuda")]
    calls.clear()
    policy.onload()
    assert calls == [("policy", "cuda"), ("reference", "cuda", False), ("step-onload",)]
    calls.clear()
    policy.onload()
    assert calls == [("step-onload",)]  # weights are back; the step object's onload is idempotent itself
