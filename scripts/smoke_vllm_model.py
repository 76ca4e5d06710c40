"""The model the vLLM smoke stage (S8, ``smoke_stages_vllm.py``) and its CUDA side (``smoke_vllm_cuda.py``) both
use: a random Qwen2 whose ``</search>`` / ``</answer>`` rows read one constant hidden channel (``lift_stop_tokens``),
its HF reference forward, changed weights for the reload checks, and the probe check after a weight change. A module
of its own so that the stage and its CUDA side each import it, and not each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from smoke_common import Context, Record

STOP_STRINGS = ("</search>", "</answer>")
STOP_P_PER_TOKEN = 0.06  # each stop token's mean probability per step at temperature 1 (lift_stop_tokens)
STOP_CHANNEL = 0
STOP_SEEDS, STOP_BUDGET = 10, 24
# tolerances: fp32 on CPU (summation order only); bf16 engine vs an fp32 forward of the same bf16 weights on CUDA
LOGPROB_GAP = {"cpu": (1e-4, 1e-4), "cuda": (0.05, 0.25)}  # (mean, max) |engine - forward| per sampled token
PROBE_MEAN_GAP = {"cpu": 1e-4, "cuda": 0.05}
MEMORY_TOL = 256 << 20  # absolute tolerance of every measured-vs-planned memory figure
WEIGHTS_REL_TOL = 0.10  # weights woken vs planned: +-10% (+ 32 MiB of allocator rounding)
CUDA_FRACTION = 0.10  # rollout.gpu_memory_utilization of the engine here
CUDA_BUCKET_BYTES = 32 << 20  # the IPC buffer: several chunks for this model (the runs' BUCKET_BYTES is 1 GiB)


@dataclass(frozen=True)
class SmokeModel:
    path: Path
    shape: object  # rlinf_ext.assets.core.models.TinyQwen2Shape
    dtype: object  # torch dtype of the checkpoint = the engine's dtype
    vocab_rows: int
    sigma: float  # std of the random weights


def _shape(ctx: Context):
    from rlinf_ext.assets.core.models import TinyQwen2Shape

    if ctx.cuda:  # head size 64 (FA3); 8 layers x 11.3M + 2 x vocabulary x 1024 parameters
        return TinyQwen2Shape(
            num_hidden_layers=8,
            hidden_size=1024,
            intermediate_size=2816,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
        )
    return TinyQwen2Shape(max_position_embeddings=1024, tie_word_embeddings=False)  # head size 32 (vLLM's CPU)


def _texts() -> list[str]:
    towns = ["Arlen", "Brisk", "Corvo", "Dunmere", "Elsby", "Farrow", "Gilda", "Hollin", "Istra", "Jorvik"]
    return [
        f"Question {i}: which river runs through {towns[i % 10]}? <search> river of {towns[i % 10]} </search> "
        f"<information> the river {towns[(3 * i) % 10]}water </information> <answer> {towns[(7 * i) % 10]}water "
        f"</answer>"
        for i in range(300)
    ]


def lift_stop_tokens(model, stop_ids: list[int], per_token_p: float = STOP_P_PER_TOKEN, seed: int = 0) -> float:
    """Make each of ``stop_ids`` come with mean probability ``per_token_p`` per step at temperature 1 (in place;
    returns the head weight found). Channel ``STOP_CHANNEL`` of the residual stream is a constant (the embedding
    sets it, no attention or MLP output writes it), so the final norm's output there is positive at every
    position; only the stop tokens' head rows read it, with a weight found by bisection on random contexts."""
    import torch

    c = STOP_CHANNEL
    with torch.no_grad():
        model.model.embed_tokens.weight[:, c] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[c] = 0.0
            layer.mlp.down_proj.weight[c] = 0.0
        head = model.lm_head.weight
        head[:, c] = 0.0
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, head.shape[0], (16, 32), generator=g).to(head.device)
        hidden = model.model(input_ids=ids).last_hidden_state.float()  # after the final norm
        base, lift = model.lm_head(hidden.to(head.dtype)).float(), hidden[..., c : c + 1]

        def mean_p(weight: float) -> float:
            logits = base.clone()
            logits[..., stop_ids] += weight * lift
            return float(torch.softmax(logits, -1)[..., stop_ids].mean())

        lo, hi = 0.0, 1.0
        while mean_p(hi) < per_token_p and hi < 1e4:
            hi *= 2
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if mean_p(mid) < per_token_p else (lo, mid)
        head[stop_ids, c] = hi
    return hi


def write_stop_model(ctx: Context) -> SmokeModel:
    """The stage's model (written once per work directory): a random Qwen2 of ``_shape``, every weight
    N(0, 2/sqrt(hidden)) (norms 1 + N(0, 0.1)), stop tokens lifted, saved in the engine's dtype."""
    import torch

    from rlinf_ext.assets.core.models import (
        make_qwen2,
        padded_vocab_size,
        save_hf_model,
    )
    from rlinf_ext.assets.core.tokenizer import train_tokenizer

    shape = _shape(ctx)
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    sigma = 2.0 / shape.hidden_size**0.5
    out = ctx.work / ("qwen2-stop-91m" if ctx.cuda else "qwen2-stop-tiny")
    tok = None
    if not (out / "config.json").is_file():
        tok = train_tokenizer(_texts(), vocab_size=800)
        model = make_qwen2(tok, shape, seed=0)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=g)
                p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else sigma * noise)
        model.to(ctx.torch_device)
        lift_stop_tokens(model, [tok.convert_tokens_to_ids(s) for s in STOP_STRINGS])
        save_hf_model(model.to("cpu", dtype), tok, out)
    from transformers import AutoTokenizer

    rows = padded_vocab_size(len(tok or AutoTokenizer.from_pretrained(str(out))))
    return SmokeModel(out, shape, dtype, rows, sigma)


def changed_state(model: SmokeModel, seed: int) -> dict:
    """The checkpoint's weights moved by N(0, sigma / 2) (norms by N(0, 0.05)), in the engine's dtype, on the CPU
    (the same in every process for a seed)."""
    import torch
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(1000 + seed)
    out = {}
    for name, tensor in sorted(load_file(str(model.path / "model.safetensors")).items()):
        scale = 0.05 if name.endswith("norm.weight") else model.sigma / 2
        out[name] = (tensor.float() + scale * torch.randn(tensor.shape, generator=g)).to(model.dtype)
    return out


def reference_model(model: SmokeModel, ctx: Context):
    """The HF model of the checkpoint in fp32 (the bf16 weights exactly, upcast), eager attention."""
    import torch
    from transformers import AutoModelForCausalLM

    return (
        AutoModelForCausalLM.from_pretrained(str(model.path), dtype=torch.float32, attn_implementation="eager")
        .to(ctx.torch_device)
        .eval()
    )


def load_reference(ref, state: dict) -> None:
    import torch

    with torch.no_grad():
        ref.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)


def reference_logits(ref, ids: list[int]):
    import torch

    with torch.no_grad():
        return ref(input_ids=torch.tensor([ids], device=ref.device)).logits.float().cpu()


def forward_logprobs(ref, prompt: list[int], ids: list[int], temperature: float):
    """log-softmax(logits / T) of ``ids`` after ``prompt`` (what the actor recomputes as old log-probs)."""
    import torch

    logits = reference_logits(ref, prompt + ids)[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


async def check_probe(rec: Record, gen, label: str, new_logits, old_logits, probe: list[int], device: str) -> None:
    """The probe after a weight change: the engine's prompt log-probs vs the HF forward of the new weights (and of
    the old ones, which must be far)."""
    import torch

    from rlinf_ext.sync.probe import probe_atol, probe_logprob_gap

    entries = await gen.prompt_logprobs(probe)
    ids = torch.tensor(probe)
    gap, gap_old = probe_logprob_gap(ids, new_logits, entries), probe_logprob_gap(ids, old_logits, entries)
    tol = PROBE_MEAN_GAP[device]
    rec.figure(
        f"{label}: probe gap vs the new / the old weights",
        f"{gap:.2e} / {gap_old:.3f} nats (mean over {len(probe) - 1} tokens)",
    )
    rec.check(f"{label}: probe gap vs the HF forward of the new weights <= {tol:g}", gap <= tol)
    rec.check(f"{label}: the new weights arrived (probe gap vs the old weights > 10x that)", gap_old > 10 * tol)
    worker_atol = probe_atol("bf16" if device == "cuda" else "fp32")  # the engine's dtype on each device
    rec.check(
        f"{label}: probe gap within the rollout worker's threshold (sync/probe.py probe_atol {worker_atol:g})",
        gap <= worker_atol,
    )
