"""Stages S4-S6 of scripts/gpu_smoke.py: the CUDA-IPC weight transport stand-in, the 3B-shaped actor's memory
against rlinf_ext's estimate, and the fp16 dense encoder."""

from __future__ import annotations

import time

from smoke_common import GIB, Context, Record, actor_samples, hf_model, init_parallel, tiny_model_dir

from rlinf_ext.models.rss import PeakRSS, rss

# ------------------------------------------------------------------------------------------ S4
BUCKET_BYTES = 64 * 1024  # small buckets so the tiny model needs several


def _buckets(state: dict, limit: int) -> list[list[tuple[str, object]]]:
    out, current, size = [], [], 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > limit:
            out.append(current)
            current, size = [], 0
        current.append((name, tensor))
        size += nbytes
    return out + ([current] if current else [])


def ipc_consumer(model_dir: str, dtype_name: str, device: str, inbox, outbox, ids) -> None:
    """The engine side: rebuild every bucket from its pickled handles, load it, answer with logits."""
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing  # noqa: F401  (registers the tensor reductions ForkingPickler needs)
    from transformers import AutoConfig, AutoModelForCausalLM

    if device == "cpu":
        torch.multiprocessing.set_sharing_strategy("file_system")
    dtype = getattr(torch, dtype_name)
    model = (
        AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(model_dir), dtype=dtype, attn_implementation="eager"
        )
        .to(device)
        .eval()
    )
    loaded = set()
    while (blob := inbox.get()) is not None:
        bucket = ForkingPickler.loads(blob)
        model.load_state_dict(dict(bucket), strict=False)
        loaded |= {name for name, _ in bucket}
        del bucket
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ids, device=device)).logits.float().cpu()
    outbox.put((sorted(loaded), logits))


def s4_ipc(rec: Record, ctx: Context) -> None:
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing as mp

    model_dir = tiny_model_dir(ctx)
    dtype = torch.float16 if ctx.cuda else torch.bfloat16  # bf16 on CPU: fp16 CPU kernels are incomplete
    if not ctx.cuda:
        mp.set_sharing_strategy("file_system")
    producer = hf_model(model_dir, ctx, dtype)
    state = {k: v.detach().contiguous() for k, v in producer.state_dict().items()}
    buckets = _buckets(state, BUCKET_BYTES)
    ids = [list(range(3, 30))]
    spawn = mp.get_context("spawn")
    inbox, outbox = spawn.Queue(), spawn.Queue()
    consumer = spawn.Process(
        target=ipc_consumer, args=(str(model_dir), str(dtype).split(".")[-1], ctx.device, inbox, outbox, ids)
    )
    consumer.start()
    t = time.perf_counter()
    for bucket in buckets:
        inbox.put(ForkingPickler.dumps(bucket).tobytes())  # handles only: the tensors stay in this process
    inbox.put(None)
    names, theirs = outbox.get(timeout=120)
    seconds = time.perf_counter() - t
    consumer.join(timeout=60)
    with torch.no_grad():
        ours = producer(input_ids=torch.tensor(ids, device=ctx.torch_device)).logits.float().cpu()
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    rec.figure(
        "transport",
        f"{len(buckets)} buckets, {nbytes / 2**20:.2f} MiB {str(dtype)[6:]}, {seconds:.2f} s "
        "(consumer start, model build and load included)",
    )
    rec.check("the consumer received every tensor", names == sorted(state))
    rec.check("consumer logits == producer logits (bitwise)", torch.equal(theirs, ours))
    rec.check("the consumer exited cleanly", consumer.exitcode == 0)


# ------------------------------------------------------------------------------------------ S5
def _memory_inputs(shape: str, seq: int, ctx: Context, recompute: dict):
    from rlinf_ext.assets.core.random_qwen2 import shape_config
    from rlinf_ext.models.memory import ActorMemoryInputs, ModelShape

    c = shape_config(shape)
    model = ModelShape(
        c["num_hidden_layers"],
        c["hidden_size"],
        c["intermediate_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["hidden_size"] // c["num_attention_heads"],
        c["vocab_size"],
        c["tie_word_embeddings"],
    )
    return ActorMemoryInputs(
        model,
        seq,
        precision="fp16" if ctx.cuda else "fp32",
        device=ctx.device,
        data_parallel=1,
        reference_model=True,
        flash_attention=False,
        **recompute,
    )


def s5_memory(rec: Record, ctx: Context) -> None:
    """The real actor in the reference run's settings (fp16, kl_beta 1e-3, recompute full/block/20; local spec as
    this machine has no TE), one data-parallel rank: measured peak vs models/memory.py's estimate."""
    import torch

    from rlinf_ext.assets.core.random_qwen2 import write_random_qwen2
    from rlinf_ext.models.memory import estimate_actor
    from rlinf_ext.training.megatron_policy import MegatronPolicy
    from rlinf_ext.training.rl_math import LossConfig
    from rlinf_ext.training.settings import ActorSettings

    shape, lengths = ("3b", (1024, 1536, 2048)) if ctx.cuda else ("tiny", (128, 256, 512))
    recompute = dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=20)
    init_parallel()
    model_dir = ctx.work / f"qwen2-{shape}-random"
    t = time.perf_counter()
    if not (model_dir / "config.json").is_file():
        write_random_qwen2(model_dir, shape, dtype="bfloat16" if ctx.cuda else "float32", device=ctx.device)
        if ctx.cuda:
            torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated() if ctx.cuda else rss()
    settings = ActorSettings(
        group_size=2,
        n_minibatches=1,
        micro_batch_size=1,
        logprob_micro_batch_size=1,
        loss=LossConfig(kl_beta=1e-3),
        lr=1e-6,
        total_train_steps=4,
        spec_name="local_gpt",
        precision="fp16" if ctx.cuda else "fp32",
        model_overrides=recompute,
    )
    policy = MegatronPolicy(model_dir, settings)
    ctx.sync()
    rec.figure(
        "set-up (random checkpoint, actor + reference built)",
        f"{time.perf_counter() - t:.1f} s, "
        f"{((torch.cuda.memory_allocated() if ctx.cuda else rss()) - base) / GIB:.2f} GiB",
    )
    ratios = []
    for step, seq in enumerate(lengths):
        samples = actor_samples(policy.model.hf_vocab_size, n=2, prompt=seq // 4, response=seq - seq // 4, seed=step)
        est = estimate_actor(_memory_inputs(shape, seq, ctx, recompute))
        expected = est.peak - est.items.get("reserve (context, fragmentation)", 0)
        try:
            peak, seconds = _measured_step(policy, samples, step, ctx, base)
        except torch.cuda.OutOfMemoryError as exc:
            rec.figure(
                f"T={seq}",
                f"out of memory (estimate {expected / GIB:.2f} GiB + reserve = {est.peak / GIB:.2f} "
                f"GiB): {str(exc).splitlines()[0]}",
            )
            break
        ratios.append(peak / expected)
        rec.figure(
            f"T={seq}",
            f"peak {peak / GIB:.2f} GiB measured vs {expected / GIB:.2f} GiB estimated (ratio "
            f"{peak / expected:.3f}; with reserve {est.peak / GIB:.2f} GiB); train step {seconds:.2f} s",
        )
    _forward_backward_seconds(rec, policy, ctx, lengths[1])
    if ctx.cuda:
        policy.offload(weights=True, optimizer=True, grads=True)
        rec.figure("after offload", f"{torch.cuda.memory_allocated() / GIB:.2f} GiB allocated")
        rec.figure("device", f"{torch.cuda.get_device_name(0)}, {torch.cuda.mem_get_info()[1] / GIB:.1f} GiB")
    rec.check("figures reported for at least one length", bool(ratios))
    if ctx.cuda:  # on CPU the tiny shape's figures are dominated by the process's fixed overheads
        rec.check(
            "measured / estimated within 0.75-1.25 at every length that ran", all(0.75 <= r <= 1.25 for r in ratios)
        )


def _measured_step(policy, samples, step: int, ctx: Context, base: int) -> tuple[int, float]:
    """(peak bytes above ``base`` during one train step, seconds); log-probs recomputed first."""
    import torch

    policy.recompute(samples, compute_ref=True)
    ctx.sync()
    t = time.perf_counter()
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
        policy.train_step(samples, step)
        ctx.sync()
        return torch.cuda.max_memory_allocated() - base, time.perf_counter() - t
    with PeakRSS() as peak:
        policy.train_step(samples, step)
    return peak.peak - base, time.perf_counter() - t


def _forward_backward_seconds(rec: Record, policy, ctx: Context, seq: int) -> None:
    import torch

    samples = actor_samples(policy.model.hf_vocab_size, n=1, prompt=seq // 4, response=seq - seq // 4, seed=9)
    try:
        policy.recompute(samples, compute_ref=True)
        policy.step.zero_grad()
        ctx.sync()
        t = time.perf_counter()
        loss, _ = policy._micro_loss(samples, torch.tensor([1.0]), float(sum(samples[0].response_mask)))
        policy.step.scale_loss(loss).backward()
        ctx.sync()
        rec.figure(f"forward+backward of one {seq}-token sequence", f"{time.perf_counter() - t:.3f} s")
    except torch.cuda.OutOfMemoryError:
        rec.figure(f"forward+backward of one {seq}-token sequence", "out of memory")


# ------------------------------------------------------------------------------------------ S6
def _bert_encoder(ctx: Context):
    """A random BERT encoder and its WordPiece vocabulary over synthetic passages (built once)."""
    import torch
    from transformers import BertConfig, BertModel

    from rlinf_ext.assets.core.models import build_wordpiece

    topics = ["river", "castle", "violin", "glacier", "harbor", "orchard", "comet", "lantern", "meadow", "quarry"]
    passages = [
        f"passage {i} tells of the {topics[i % 10]} near the {topics[(3 * i) % 10]} in year {1800 + i}"
        for i in range(200 if ctx.cuda else 100)
    ]
    out = ctx.work / "bert-random"
    if not (out / "config.json").is_file():
        tok = build_wordpiece(passages, out, vocab_size=400)
        torch.manual_seed(0)
        cfg = BertConfig(
            vocab_size=len(tok),
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=128,
            initializer_range=0.2,
        )
        BertModel(cfg).save_pretrained(str(out), safe_serialization=True)
        tok.save_pretrained(str(out))
    return out, passages


def s6_encoder(rec: Record, ctx: Context) -> None:
    import faiss
    import numpy as np
    import torch

    from rlinf_ext.retrieval.encoder import EncoderSpec, TextEncoder

    model_dir, passages = _bert_encoder(ctx)
    queries = [p.split(" in year")[0] for p in passages[::10]]
    k = 5
    for pooling in ("mean", "cls"):
        spec = EncoderSpec.for_retriever("e5", str(model_dir), pooling=pooling)
        reference = TextEncoder(spec, device="cpu")  # fp32
        device = TextEncoder(spec, device=ctx.device)  # fp16 on CUDA
        if not ctx.cuda:
            device.model.to(torch.bfloat16)  # CPU: the reduced-precision path in bf16
        found = {}
        for name, enc in (("fp32 cpu", reference), ("device", device)):
            p, q = enc.encode(passages, is_query=False), enc.encode(queries, is_query=True)
            index = faiss.IndexFlatIP(p.shape[1])
            index.add(np.ascontiguousarray(p, dtype=np.float32))
            found[name] = (p, q, *index.search(np.ascontiguousarray(q, dtype=np.float32), k))
        (p32, q32, s32, i32), (pdev, _, _, idev) = found["fp32 cpu"], found["device"]
        cosine = float((p32 * pdev).sum(1).min())
        # the device's top-k must be a top-k under the fp32 scores up to a margin (near-ties may swap; a wrong
        # passage scores far below the k-th): 1e-3 for fp16 on CUDA, 1e-2 for bf16 (8 bits of mantissa) on CPU
        margin, floor = (1e-3, 0.999) if ctx.cuda else (1e-2, 0.99)
        fp32_scores_of_device_picks = np.einsum("qd,qkd->qk", q32, p32[idev])
        valid = fp32_scores_of_device_picks >= s32[:, k - 1 : k] - margin
        rec.figure(
            f"{pooling} pooling",
            f"min cosine {cosine:.5f}; device top-{k} picks within {margin:g} of the "
            f"fp32 k-th score: {valid.mean():.3f}; same ids in order: "
            f"{(idev == i32).mean():.3f}",
        )
        rec.check(f"{pooling}: min cosine >= {floor}", cosine >= floor)
        rec.check(f"{pooling}: top-{k} valid under fp32 scores (margin {margin:g})", bool(valid.all()))
