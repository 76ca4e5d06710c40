"""Stages S0-S3 of scripts/gpu_smoke.py: environment, tiny assets, converter logits, the tiny actor."""

from __future__ import annotations

import importlib
import importlib.util
import math
import time

from smoke_common import (
    GIB,
    Context,
    Record,
    SkipStage,
    actor_samples,
    hf_model,
    init_parallel,
    max_abs,
    tiny_model_dir,
)


# ------------------------------------------------------------------------------------------ S0, S1
def s0_environment(rec: Record, ctx: Context) -> None:
    import platform

    import torch

    rec.figure("python", platform.python_version())
    rec.figure("torch", f"{torch.__version__} (CUDA {torch.version.cuda})")
    if ctx.cuda:
        ok = rec.check("a CUDA device is visible", torch.cuda.is_available())
        if ok:
            props = torch.cuda.get_device_properties(0)
            free, total = torch.cuda.mem_get_info()
            rec.figure(
                "gpu",
                f"{props.name}, capability {props.major}.{props.minor}, {total / GIB:.1f} GiB total, "
                f"{free / GIB:.1f} GiB free",
            )
    imported = set()
    for name in (
        "megatron.core",
        "transformers",
        "tokenizers",
        "huggingface_hub",
        "omegaconf",
        "hydra",
        "faiss",
        "numpy",
        "triton",
        "transformer_engine",
        "bm25s",
        "pyarrow",
    ):
        try:
            module = importlib.import_module(name)
            rec.figure(name, getattr(module, "__version__", "present"))
            imported.add(name)
        except Exception as exc:  # noqa: BLE001
            rec.figure(name, f"missing ({type(exc).__name__}: {exc})")
    for name in ("megatron.core", "transformers", "tokenizers", "faiss", "omegaconf"):
        rec.check(f"import {name}", name in imported)
    import transformers

    rec.check("transformers 5.19.x first on the path (the stack's pin)", transformers.__version__.startswith("5.19"))
    importlib.import_module("rlinf.algorithms")
    rec.check("import rlinf.algorithms (rlinf.scheduler and ray stubbed)", True)
    for name in ("rlinf_ext.training.megatron_policy", "rlinf_ext.convert.mapping", "rlinf_ext.retrieval.dense"):
        importlib.import_module(name)
        rec.check(f"import {name}", True)
    from rlinf_ext.models.megatron import te_available

    rec.figure("Transformer Engine layer spec usable", te_available())


def s1_assets(rec: Record, ctx: Context) -> None:
    missing = [m for m in ("bm25s", "pyarrow") if importlib.util.find_spec(m) is None]
    if missing:
        raise SkipStage(
            f"rlinf_ext's tiny-asset generator needs {', '.join(missing)} (lexical retriever, parquet "
            "files), not installed here; stages S2-S6 build their own random models instead"
        )
    from rlinf_ext.assets.core.tiny import make_tiny_assets

    t = time.perf_counter()
    assets = make_tiny_assets(ctx.work / "tiny_assets", seed=0)
    rec.figure("seconds", round(time.perf_counter() - t, 1))
    rec.check(
        "built (manifest, tokenizer, qwen2-tiny, bert encoder)",
        assets.manifest_path.is_file()
        and (assets.qwen2_tiny / "config.json").is_file()
        and (assets.bert_encoder / "config.json").is_file(),
    )


# ------------------------------------------------------------------------------------------ S2
def s2_converter(rec: Record, ctx: Context) -> None:
    import torch

    from rlinf_ext.convert.mapping import ConvertSpec
    from rlinf_ext.convert.state_dicts import hf_to_megatron, megatron_to_hf
    from rlinf_ext.models.megatron import build_gpt_model, forward_logits, load_megatron_state_dict

    init_parallel()
    model_dir = tiny_model_dir(ctx)
    hf = hf_model(model_dir, ctx, torch.float32)
    spec = ConvertSpec.from_hf_config(model_dir, te_layernorm_names=False)
    hf_state = {k: v.detach().cpu() for k, v in hf.state_dict().items()}
    mg = build_gpt_model(model_dir, params_dtype=torch.float32, init_weights=False, use_te=False)
    load_megatron_state_dict(mg, hf_to_megatron(hf_state, spec, tp=1, pp=1)[(0, 0)], source="S2")
    mg.to(ctx.torch_device).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, hf.config.vocab_size, (2, 12), generator=g).to(ctx.torch_device)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = forward_logits(mg, ids, attention_mask=mask, position_ids=pos)
        d32 = max_abs(got, ref, mask[..., None].expand_as(ref))
        with torch.autocast(ctx.torch_device.type, dtype=torch.bfloat16):
            ref16 = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            got16 = forward_logits(mg, ids, attention_mask=mask, position_ids=pos)
        d16 = max_abs(got16, ref16, mask[..., None].expand_as(ref))
    rec.figure("fp32 max |logit difference| (left-padded batch)", f"{d32:.2e}")
    rec.figure("bf16 autocast max |logit difference|", f"{d16:.2e}")
    rec.check("fp32 logits match (max |diff| <= 1e-4)", d32 <= 1e-4)
    rec.check("bf16 autocast logits match (max |diff| <= 5e-2)", d16 <= 5e-2)
    mg_state = {
        k: v.detach().cpu() for k, v in mg.state_dict().items() if torch.is_tensor(v) and not k.endswith("_extra_state")
    }
    back = megatron_to_hf({(0, 0): mg_state}, spec)
    expected = {k for k in hf_state if not (k == "lm_head.weight" and hf.config.tie_word_embeddings)}
    rec.check(
        "megatron_to_hf round trip is exact (names and values)",
        set(back) == expected and all(torch.equal(back[k], hf_state[k]) for k in back),
    )


# ------------------------------------------------------------------------------------------ S3
def _settings(**kw):
    from rlinf_ext.training.rl_math import LossConfig
    from rlinf_ext.training.settings import ActorSettings

    base = dict(
        group_size=2,
        n_minibatches=1,
        micro_batch_size=2,
        logprob_micro_batch_size=4,
        loss=LossConfig(kl_beta=1e-3),
        lr=1e-4,
        weight_decay=0.0,
        total_train_steps=8,
        spec_name="local_gpt",
    )
    base.update(kw)
    return ActorSettings(**base)


def _hf_logprobs(hf, samples, temperature: float):
    import torch

    from rlinf_ext.training.batching import gather_logprobs, pack_sequences

    batch = pack_sequences(
        [s.prompt_ids for s in samples], [s.response_ids for s in samples], [s.response_mask for s in samples], 0
    )
    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids.to(hf.device)).logits.float().cpu()
    lp = gather_logprobs(logits / temperature, batch.input_ids)
    return [lp[i, len(s.prompt_ids) - 1 : len(s.prompt_ids) - 1 + len(s.response_ids)] for i, s in enumerate(samples)]


def _train(policy, samples, steps, first_step, ctx):
    t = time.perf_counter()
    metrics = [policy.train_step(samples, first_step + k)[-1] for k in range(steps)]
    ctx.sync()
    tokens = steps * sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    return metrics, tokens / (time.perf_counter() - t)


def _device_memory_held(ctx) -> int:
    import gc

    import torch

    gc.collect()
    return torch.cuda.memory_allocated() if ctx.cuda else 0


def _s3_offload(rec, ctx, policy, samples, held: int) -> None:
    """`held`: device memory allocated before the policy was built. The first H100 run (75.8 -> 72.2 MiB) counted
    the whole process, and the snapshot was cloned on the GPU between the two readings."""
    import torch

    if not ctx.cuda:
        rec.figure("offload/onload", "no-op on CPU (nothing to free)")
        return
    ctx.sync()
    before = torch.cuda.memory_allocated() - held
    snapshot = {k: v.detach().to("cpu", copy=True) for k, v in policy.megatron_state_dict().items()}
    policy.offload(weights=True, optimizer=True, grads=True)
    after = torch.cuda.memory_allocated() - held
    policy.onload()
    same = all(torch.equal(snapshot[k], v.cpu()) for k, v in policy.megatron_state_dict().items())
    m = policy.train_step(samples, 10)[-1]
    rec.figure("GPU memory of the policy before / after offload", f"{before / 2**20:.1f} / {after / 2**20:.1f} MiB")
    rec.check("offload frees the actor's GPU memory (<= 10% left)", after <= 0.1 * before)
    rec.check("weights bit-equal after onload", same)
    rec.check("a train step after onload updates", m["update_success"] == 1.0 and math.isfinite(m["loss"]))


def _s3_save_load(rec, ctx, label, policy, samples, settings, model_dir) -> None:
    import torch

    from rlinf_ext.training.grpo_policy import Sample
    from rlinf_ext.training.megatron_policy import MegatronPolicy

    ckpt = ctx.work / "s3_checkpoints" / label.replace(" ", "_")
    policy.save(ckpt, iteration=4)
    other = MegatronPolicy(model_dir, settings)
    other.load(ckpt)
    twins = [
        Sample(s.prompt_ids, s.response_ids, s.response_mask, s.reward, s.old_logprobs, s.ref_logprobs) for s in samples
    ]
    m1, m2 = policy.train_step(samples, 11)[-1], other.train_step(twins, 11)[-1]
    same = all(torch.equal(v, other.megatron_state_dict()[k]) for k, v in policy.megatron_state_dict().items())
    rec.check(
        f"{label}: save/load resumes identically (loss, loss scale, weights)",
        m1["loss"] == m2["loss"] and m1.get("loss_scale") == m2.get("loss_scale") and same,
    )


def s3_actor(rec: Record, ctx: Context) -> None:
    import torch

    from rlinf_ext.training.megatron_policy import MegatronPolicy

    init_parallel()
    model_dir = tiny_model_dir(ctx)
    hf32 = hf_model(model_dir, ctx, torch.float32)
    vocab = hf32.config.vocab_size
    for temperature in (
        (1.0, 0.7) if ctx.cuda else (0.7,)
    ):  # fp32 actor: log-probs of exactly the trajectory ids, tempered
        policy = MegatronPolicy(model_dir, _settings(precision="fp32", temperature=temperature))
        samples = actor_samples(vocab)
        gap = max(
            max_abs(a, b) for a, b in zip(policy.compute_logprobs(samples), _hf_logprobs(hf32, samples, temperature))
        )
        rec.figure(f"fp32 log-probs vs HF at temperature {temperature}: max |diff|", f"{gap:.2e}")
        rec.check(f"fp32 log-probs match HF at temperature {temperature} (<= 1e-3)", gap <= 1e-3)
    variants = (
        ("bf16", dict(precision="bf16")),
        ("fp16 static", dict(precision="fp16", loss_scale=65536.0)),
        ("fp16 dynamic", dict(precision="fp16")),
    )
    if not ctx.cuda:  # CPU (the script's own test): the CPU paths are unit-tested; keep the run short
        variants = variants[::2]
    for label, kw in variants:
        settings = _settings(**kw)
        held = _device_memory_held(ctx)  # earlier policies and the HF reference: not this policy's to offload
        policy = MegatronPolicy(model_dir, settings)
        samples = actor_samples(vocab)
        policy.recompute(samples, compute_ref=True)
        gap = max(max_abs(s.old_logprobs, h) for s, h in zip(samples, _hf_logprobs(hf32, samples, 1.0)))
        before = {k: v.clone() for k, v in policy.megatron_state_dict().items()}  # CPU: .cpu() is no copy
        metrics, tokens_per_s = _train(policy, samples, 3, 0, ctx)
        m = metrics[-1]
        changed = any(not torch.equal(before[k], v) for k, v in policy.megatron_state_dict().items())
        rec.figure(
            label,
            f"loss {m['loss']:.5f}, grad norm {m['grad_norm']:.4g}, loss scale {m.get('loss_scale', '-')}, "
            f"updates {[x['update_success'] for x in metrics]}, {tokens_per_s:.0f} tokens/s, "
            f"log-probs vs HF fp32 max |diff| {gap:.3f}",
        )
        rec.check(
            f"{label}: finite loss and grad norm, weights changed",
            math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and changed,
        )
        rec.check(f"{label}: log-probs close to HF fp32 (<= 0.2)", gap <= 0.2)
        if label == "fp16 dynamic":
            _s3_offload(rec, ctx, policy, samples, held)
            _s3_probe(rec, ctx, policy, model_dir)
        _s3_save_load(rec, ctx, label, policy, samples, settings, model_dir)


def _s3_probe(rec, ctx, policy, model_dir) -> None:
    """The weight-sync check: the actor's probe logits vs an fp16 HF model holding the weights the rollout gets."""
    import torch

    hf16 = hf_model(model_dir, ctx, torch.float16 if ctx.cuda else torch.float32)
    hf16.load_state_dict(policy.hf_state_dict(dtype=hf16.dtype), strict=False)
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        theirs = torch.log_softmax(hf16(input_ids=ids.to(ctx.torch_device)).logits.float().cpu(), -1)
    ours = torch.log_softmax(policy.probe_logits(ids), -1)
    gap = max_abs(ours, theirs)
    rec.figure("probe: max |log-prob gap| actor vs fp16 HF", f"{gap:.3e}")
    rec.check("probe gap <= 0.5", gap <= 0.5)
