"""Offloading the FSDP2 actor (``training/fsdp_policy_offload.py``) on CPU: after offload + onload the parameters
and the AdamW state are bit-exact, the ``Parameter`` objects the optimizer keys its state by are the same, the
storage really moved (a copy, not a no-op), and the next training step equals the step of a twin policy that never
offloaded, in one process and with FSDP2 over two gloo ranks (sharded DTensor parameters: the tiny VL policy, slow;
a small fully_shard-ed MLP, fast). The weight sync streams from an offloaded policy without bringing it back, and
over two ranks (activation checkpointing on) every rank streams rank 0's full state dict, name for name."""

from __future__ import annotations

import os
import socket

import pytest
import torch
from fsdp_policy_helpers import check_every_rank_streams, samples_of, save_streamed_weights, settings

from rlinf_ext.training.fsdp_policy import FSDPPolicy
from tests.support.spawn_ranks import spawn_ranks

ADAM = dict(optimizer="adam", lr=1e-3, clip_grad=1.0)
REWARDS = [1.0, 0.0, 0.0, 1.0]  # two GRPO groups of 2


@pytest.fixture(scope="module")
def world(vl_world):
    return vl_world


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def snapshot(policy: FSDPPolicy) -> dict[str, torch.Tensor]:
    """This rank's shards of every parameter and optimizer state tensor, copied."""
    names = {id(p): n for n, p in policy.model.named_parameters()}
    out = {f"param:{n}": _local(p).detach().clone() for n, p in policy.model.named_parameters()}
    for param, state in policy.optimizer.state.items():
        for key, value in state.items():
            if torch.is_tensor(value):
                out[f"optim:{names[id(param)]}:{key}"] = _local(value).detach().clone()
    return out


def storages(policy: FSDPPolicy) -> tuple[set[int], list]:
    """Addresses of the storages of every parameter shard and optimizer state tensor, and the storages themselves:
    the caller holds them while it compares, so a freed block reused by a new tensor cannot look "left in place"."""
    held = [_local(p).untyped_storage() for p in policy.model.parameters()]
    held += [
        _local(v).untyped_storage()
        for s in policy.optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dim() > 0
    ]
    return {h.data_ptr() for h in held}, held


def round_trip(policy: FSDPPolicy) -> None:
    """offload (weights, optimizer, gradients) + onload, checking what each half did."""
    params = list(policy.model.parameters())
    keyed = set(map(id, policy.optimizer.state))
    before, (where, held) = snapshot(policy), storages(policy)
    policy.offload(weights=True, optimizer=True, grads=True)
    assert policy.offloaded and all(p.grad is None for p in params)
    assert not (storages(policy)[0] & where), "offload left state in place"
    del held
    policy.onload()
    assert not policy.offloaded
    assert [id(p) for p in policy.model.parameters()] == list(map(id, params)) and set(
        map(id, policy.optimizer.state)
    ) == keyed
    after = snapshot(policy)
    assert after.keys() == before.keys() and any(k.startswith("optim:") for k in after)
    for key in before:
        assert torch.equal(after[key], before[key]), key


@pytest.mark.slow
def test_round_trip_is_bit_exact_and_the_next_step_equals_one_without(world):
    mm, trajs = world
    samples = samples_of(trajs[:4], rewards=REWARDS)
    a = FSDPPolicy(mm.qwen2_5_vl_tiny, settings(**ADAM))
    b = FSDPPolicy(mm.qwen2_5_vl_tiny, settings(**ADAM))
    for policy in (a, b):
        policy.recompute(samples, compute_ref=False)
        policy.train_step(samples, step=0)  # AdamW state exists from here on
    round_trip(a)
    a.offload(weights=True, optimizer=True, grads=True)  # train_step onloads by itself
    for policy in (a, b):
        policy.train_step(samples, step=1)
    sa, sb = a.hf_state_dict(), b.hf_state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sb)
    assert snapshot(a).keys() == snapshot(b).keys()
    assert all(torch.equal(x, y) for x, y in zip(snapshot(a).values(), snapshot(b).values()))


def test_an_offloaded_policy_syncs_and_saves_and_stays_offloaded(world, tmp_path):
    """The weight sync's probe and gathers and a checkpoint bring the state for their call only."""
    mm, trajs = world
    policy = FSDPPolicy(mm.qwen2_5_vl_tiny, settings(**ADAM))
    ids, images, _ = policy.probe()
    expected, weights = policy.probe_logits(ids, images), policy.hf_state_dict()
    policy.offload(weights=True, optimizer=True, grads=True)
    with policy.weights_on_device():
        assert torch.equal(policy.probe_logits(ids, images), expected)
        assert all(torch.equal(v, weights[k]) for k, v in policy.hf_state_dict().items())
    streamed = list(policy.iter_hf_weights())  # one tensor at a time: the offloaded model stays where it is
    assert [n for n, _ in streamed] == list(weights) and all(torch.equal(t, weights[n]) for n, t in streamed)
    assert policy.offloaded and policy._offload.state.weights and policy._offload.state.optimizer
    policy.save(tmp_path / "ckpt", iteration=1)
    assert policy._offload.state.weights and policy._offload.state.optimizer
    assert (tmp_path / "ckpt" / "hf_actor.json").is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dp_offload_worker(rank: int, world: int, port: int, model_dir: str, payload: str, out: str) -> None:
    """One gloo rank with two FSDP2 policies (a: round trip between the steps, b: none); rank 0 saves both."""
    from torch.distributed.tensor import DTensor

    from rlinf_ext.training.data_parallel import ShardLayout
    from rlinf_ext.training.fsdp_policy import FSDPSettings
    from tests.support.gloo_dp import init_gloo_dp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dp = init_gloo_dp()
    samples = torch.load(payload, weights_only=False)
    share = len(samples) // world
    mine = list(range(rank * share, (rank + 1) * share))
    layout = ShardLayout(tuple(mine), len(samples))
    # activation checkpointing on, as in the 7B config: the streamed names must still be the state dict's
    fsdp = FSDPSettings(
        freeze_vision_tower=False,
        gradient_checkpointing=True,
        reshard_after_forward=True,
        param_dtype="bf16",
        reduce_dtype="fp32",
    )
    a, b = (FSDPPolicy(model_dir, settings(group_size=2, **ADAM), dp=dp, fsdp=fsdp) for _ in range(2))
    for policy in (a, b):
        policy.recompute([samples[i] for i in mine], compute_ref=False)
        policy.train_step([samples[i] for i in mine], step=0, layout=layout)
    assert all(isinstance(p, DTensor) for p in a.model.parameters())  # the sharded path, not a plain module
    round_trip(a)
    a.offload(weights=True, optimizer=True, grads=True)
    for policy in (a, b):
        policy.train_step([samples[i] for i in mine], step=1, layout=layout)
    a.offload(weights=True, optimizer=True, grads=True)  # the collocated sync streams from offloaded shards
    save_streamed_weights(a, out, rank, torch.bfloat16)
    assert a._offload.state.weights, "streaming the weights brought the offloaded model back"
    states = [a.hf_state_dict(), b.hf_state_dict()]  # collective; rank 0 alone gets the weights
    if rank == 0:
        torch.save(states, out)
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # ~2 min on 2 busy cores: two spawned gloo ranks, two policies each
@pytest.mark.timeout(600)
def test_fsdp2_round_trip_over_two_gloo_ranks(world, tmp_path):
    mm, trajs = world
    samples = samples_of(trajs[:4], rewards=REWARDS)
    FSDPPolicy(mm.qwen2_5_vl_tiny, settings(**ADAM)).recompute(samples, compute_ref=False)
    payload, out = tmp_path / "samples.pt", tmp_path / "states.pt"
    torch.save(samples, payload)
    spawn_ranks(dp_offload_worker, args=(2, _free_port(), str(mm.qwen2_5_vl_tiny), str(payload), str(out)), nprocs=2)
    sa, sb = torch.load(out)
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sb)
    check_every_rank_streams(out, {k: v.to(torch.bfloat16) for k, v in sa.items()}, 2)  # cast before the gather


def mlp_offload_worker(rank: int, world: int, port: int, out: str) -> None:
    """``FSDPOffload`` on a small ``fully_shard``-ed MLP (per layer, then the root) with AdamW over two gloo ranks:
    the round trip moves the DTensor shards and keeps them bit-exact; the next step equals a twin's."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from rlinf_ext.training.fsdp_policy_offload import FSDPOffload

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    twins = []
    for _ in range(2):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        twins.append((model, torch.optim.AdamW(model.parameters(), lr=1e-2)))
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(rank))

    def step(model, opt):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    for model, opt in twins:
        step(model, opt)
    (model, opt), (twin, twin_opt) = twins
    assert all(isinstance(p, DTensor) for p in model.parameters())
    params = list(model.parameters())

    def local():
        return [p.to_local().clone() for p in params] + [
            v.to_local().clone()
            for s in opt.state.values()  # noqa: E731
            for v in s.values()
            if isinstance(v, DTensor)
        ]

    where = {p.to_local().untyped_storage().data_ptr() for p in params}
    before = local()
    offload = FSDPOffload(model, None, opt, torch.device("cpu"))
    offload.offload(weights=True, optimizer=True, grads=True)
    assert all(p.grad is None for p in params) and offload.offloaded
    assert not ({p.to_local().untyped_storage().data_ptr() for p in params} & where)
    offload.onload()
    assert list(model.parameters()) == params and all(p in opt.state for p in params)
    assert all(torch.equal(a, b) for a, b in zip(local(), before))
    for m, o in twins:
        step(m, o)
    full = [[p.full_tensor() for p in m.parameters()] for m, _ in twins]
    if rank == 0:
        torch.save(full, out)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_offload_of_fully_sharded_dtensors_over_two_gloo_ranks(tmp_path):
    out = tmp_path / "full.pt"
    spawn_ranks(mlp_offload_worker, args=(2, _free_port(), str(out)), nprocs=2)
    a, b = torch.load(out)
    assert len(a) == 4 and all(torch.equal(x, y) for x, y in zip(a, b))
