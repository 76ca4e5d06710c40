"""Stage S7 of scripts/gpu_smoke.py: the FSDP2 vision-language actor (``training/fsdp_policy.py``) on one device.

On CUDA the policy is ``fully_shard``-ed over a one-rank NCCL group (the same nesting and MixedPrecisionPolicy as
on 8 GPUs, bf16 compute with fp32 shards and fp32 reduction; only the collectives have one member), on a random
Qwen2.5-VL of ~0.4B parameters; on CPU (the script's own test) the tiny shape over a one-rank gloo group.
Checks: the decoder computes in the configured dtype, training steps are finite and move the weights, activation
checkpointing lowers the training step's peak, offload frees the device (weights, AdamW state, gradients) and
onload restores every tensor bit-exactly, and the gathered HF weights (what a weight sync sends) reproduce the
policy's probe logits in a plain transformers model.
"""

from __future__ import annotations

import gc
import math
import os
import socket

from smoke_common import GIB, Context, Record, max_abs

# ~0.4B on CUDA: big enough that the offload and the checkpointing gains are far above allocator noise
CUDA_SHAPE = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=8,
    num_attention_heads=12,
    num_key_value_heads=2,
    vision_depth=4,
    vision_hidden_size=640,
    vision_intermediate_size=1664,
    vision_num_heads=10,
)
TEXTS = [
    "the emblem of the city is a red circle with stripes",
    "search the image then answer the question",
    "which colour is the flag of the northern province",
    "<think> the picture shows a square </think>",
] * 8


def _one_rank_group(ctx: Context):
    import torch.distributed as dist

    from rlinf_ext.training.data_parallel import DataParallel

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
        dist.init_process_group("nccl" if ctx.cuda else "gloo", rank=0, world_size=1)
    return DataParallel(0, 1, dist.group.WORLD, dist.group.WORLD)


def _vl_model_dir(ctx: Context):
    from rlinf_ext.assets.mmsearch import models as vl_models

    out = ctx.work / ("qwen2.5-vl-0.4b-random" if ctx.cuda else "qwen2.5-vl-tiny-random")
    if not (out / "config.json").is_file():
        tokenizer = vl_models.train_vl_tokenizer(TEXTS)
        processor = vl_models.make_processor(tokenizer)
        shape = vl_models.TinyVLShape(**CUDA_SHAPE) if ctx.cuda else vl_models.TinyVLShape()
        vl_models.save_vl_model(vl_models.make_qwen2_5_vl(tokenizer, shape, seed=0), processor, out)
    return out


def _samples(policy, n: int, length: int):
    """`n` trajectories of `length` tokens: the probe's image and random allowed text, the first quarter prompt."""
    from rlinf_ext.training.fsdp_policy import MMSample

    out = []
    for i in range(n):
        ids, images, _ = policy.probe(length=length, seed=i)
        ids = ids[0].tolist()
        cut = len(ids) // 4
        out.append(MMSample(ids[:cut], ids[cut:], [1] * (len(ids) - cut), reward=float(i % 2), images=images))
    return out


def _settings(ctx: Context):
    from rlinf_ext.training.settings import ActorSettings

    return ActorSettings(
        group_size=2,
        optimizer="adam",
        lr=1e-4 if ctx.cuda else 1e-3,
        clip_grad=1.0,
        seed=3,
        weight_decay=0.0,
        total_train_steps=8,
    )


def _fsdp(checkpointing: bool):
    from rlinf_ext.training.fsdp_policy import FSDPSettings

    return FSDPSettings(
        freeze_vision_tower=False,
        gradient_checkpointing=checkpointing,
        reshard_after_forward=True,
        param_dtype="bf16",
        reduce_dtype="fp32",
    )


def _allocated(ctx: Context) -> int:
    import torch

    return torch.cuda.memory_allocated() if ctx.cuda else 0


def _train_peak(policy, samples, step: int, ctx: Context) -> tuple[dict, float]:
    """One GRPO step (recompute + train); (last metrics, peak GiB above the memory held before the step)."""
    import torch

    policy.recompute(samples, compute_ref=False)
    if ctx.cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = _allocated(ctx)
    metrics = policy.train_step(samples, step=step)[-1]
    peak = (torch.cuda.max_memory_allocated() - base) / GIB if ctx.cuda else 0.0
    return metrics, peak


def _snapshot(policy) -> dict:
    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    out = {f"p:{n}": local(p).detach().to("cpu", copy=True) for n, p in policy.model.named_parameters()}
    for i, state in enumerate(policy.step.optimizer.state.values()):
        out.update(
            {f"o:{i}:{k}": local(v).detach().to("cpu", copy=True) for k, v in state.items() if hasattr(v, "dim")}
        )
    return out


def s7_fsdp_vl(rec: Record, ctx: Context) -> None:
    import torch

    from rlinf_ext.training.fsdp_policy import FSDPPolicy, load_vl_model

    dp = _one_rank_group(ctx)
    model_dir = _vl_model_dir(ctx)
    length, n = (4000, 2) if ctx.cuda else (64, 2)  # within max_position_embeddings 4096
    peaks = {}
    for checkpointing in (False, True):
        gc.collect()
        if ctx.cuda:
            torch.cuda.empty_cache()
        base = _allocated(ctx)  # what is on the device before this policy (freed policies leave ~0)
        policy = FSDPPolicy(model_dir, _settings(ctx), dp=dp, fsdp=_fsdp(checkpointing))
        rec.check("policy is FSDP2-sharded over the one-rank group", policy.sharded)
        seen = []
        layer = policy.model.model.language_model.layers[0].mlp.down_proj
        hook = layer.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        samples = _samples(policy, n, length)
        before = {k: v for k, v in _snapshot(policy).items() if k.startswith("p:")}
        _train_peak(policy, samples, 0, ctx)  # the first step creates AdamW's state
        metrics, peak = _train_peak(policy, samples, 1, ctx)  # peak above weights + AdamW state: activations, grads
        hook.remove()
        expected = torch.bfloat16 if ctx.cuda else torch.float32  # the MixedPrecisionPolicy applies on CUDA only
        label = "checkpointing" if checkpointing else "no checkpointing"
        rec.check(f"{label}: decoder computes in {expected}", seen and all(d == expected for d in seen))
        after = _snapshot(policy)
        rec.check(
            f"{label}: finite loss and grad norm, weights changed",
            math.isfinite(metrics["loss"])
            and math.isfinite(metrics["grad_norm"])
            and any(not torch.equal(before[k], after[k]) for k in before),
        )
        peaks[checkpointing] = peak
        rec.figure(
            f"{label}: second train step at {n}x{length} tokens",
            f"loss {metrics['loss']:.4f}, grad norm {metrics['grad_norm']:.3g}, peak above resident {peak:.2f} GiB",
        )
        if not checkpointing:
            n_params = sum(p.numel() for p in policy.model.parameters())
            rec.figure("parameters", f"{n_params / 1e6:.1f} M")
            del policy, samples, hook, layer
    if ctx.cuda:
        rec.check("activation checkpointing lowers the step's peak", peaks[True] < peaks[False])
        rec.figure("peak ratio checkpointing / none", f"{peaks[True] / peaks[False]:.2f}")
    _offload_round_trip(rec, ctx, policy, samples, base)
    _sync_probe(rec, ctx, policy, model_dir, load_vl_model)


def _offload_round_trip(rec: Record, ctx: Context, policy, samples, base: int) -> None:
    """`base`: the device memory held before the policy was built (not the policy's to free)."""
    import torch

    resident = _allocated(ctx) - base
    state = _snapshot(policy)
    policy.offload(weights=True, optimizer=True, grads=True)
    off = _allocated(ctx) - base
    policy.onload()
    back = _allocated(ctx) - base
    rec.figure(
        "device memory: trained / offloaded / onloaded",
        f"{resident / GIB:.2f} / {off / GIB:.3f} / {back / GIB:.2f} GiB",
    )
    if ctx.cuda:
        rec.check("offload frees >= 95% of the policy's device memory", off <= 0.05 * resident)
    restored = _snapshot(policy)
    rec.check(
        "onload restores weights and AdamW state bit-exactly",
        restored.keys() == state.keys() and all(torch.equal(state[k], restored[k]) for k in state),
    )
    metrics, _ = _train_peak(policy, samples, 1, ctx)
    rec.check("a training step after the round trip is finite", math.isfinite(metrics["loss"]))


def _sync_probe(rec: Record, ctx: Context, policy, model_dir, load_vl_model) -> None:
    """What the weight sync sends (the gathered HF weights) loaded into a plain transformers model: the policy's
    probe logits again (the same packed batch and mrope positions)."""
    import torch

    from rlinf_ext.training.fsdp_policy import MMSample

    ids, images, positions = policy.probe()
    ours = policy.probe_logits(ids, images)[0, positions]
    plain = load_vl_model(model_dir).to(policy.device).eval()
    plain.load_state_dict(policy.hf_state_dict(dtype=torch.float32), strict=True)
    batch = policy._pack(
        [MMSample(ids[0, :1].tolist(), ids[0, 1:].tolist(), [1] * (ids.shape[1] - 1), images=list(images))]
    )
    with torch.no_grad():
        out = plain(
            input_ids=batch.input_ids.to(policy.device),
            attention_mask=batch.attention_mask.to(policy.device),
            position_ids=policy.rope_positions(batch).to(policy.device),
            use_cache=False,
            **{k: v.to(policy.device) for k, v in batch.vision.items()},
        )
    theirs = out.logits.float().cpu()[0, positions]
    gap = max_abs(torch.log_softmax(ours, -1), torch.log_softmax(theirs, -1))
    rec.figure("probe: max |log-prob gap| sharded actor vs plain model with the gathered weights", f"{gap:.3e}")
    bound = 0.1 if ctx.cuda else 1e-4  # CUDA: bf16 compute (MixedPrecisionPolicy) vs the plain fp32 model
    rec.check(f"probe gap <= {bound}", gap <= bound)
