"""Stage S8 of scripts/gpu_smoke.py: rlinf_ext's vLLM generator (``generation/vllm_engine.py:VLLMGenerator``) on
the device, against a forward pass of the same Hugging Face model.

The model is a random Qwen2 written to the work directory (CUDA: ~91M parameters in bf16, so that the memory terms
stand far above the allocator's granularity; CPU: the tiny test shape in fp32) with the tiny assets' kind of
tokenizer, whose ``</search>`` and ``</answer>`` are single tokens. One hidden channel carries a constant that no
layer writes to, and only those two rows of the (untied) output head read it: sampling then reaches a stop
string within a few tokens while every other logit stays random (``lift_stop_tokens``).

Checks, on either device:
- stop strings: each sampled reply with ``stop=["</search>", "</answer>"]`` is the free reply of the same seed cut
  where a stop string (or EOS) first completes: ids, finish reason, matched stop, text; excluded from the text
  when the caller asks;
- processed log-probs at temperature 0.7 and 1.0 vs the HF forward's log-softmax(logits / T); at 0.7 the untempered
  values are far (the comparison tells them apart);
- seeds: the same seed gives the same ids, other seeds differ;
- in-place reload (``begin_weight_load`` / ``load_weight_bucket`` x 3 / ``finish_weight_load``) of changed weights,
  checked with ``sync/probe.py:probe_logprob_gap`` against the HF forward of the new weights (and far from the old).
CUDA only (recorded as skipped on CPU, with the reason):
- ``sleep(level=1)`` and ``sleep(level=2)`` then ``wake_up`` (weights, then KV cache): GPU memory freed and re-taken
  (``torch.cuda.mem_get_info``, device-wide like nvidia-smi's free figure) and host RAM taken, against
  ``models/memory.py``'s terms (engine fraction, CUDA context, weights, runtime, KV cache, asleep resident, host RAM
  per level);
- the collocated IPC route: ``VLLMGpuSync`` on the ``AsyncLLM`` (``weight_transfer_config={"backend": "ipc"}``):
  sleep, INIT, START (weights woken), UPDATE per packed chunk, FINISH, then ``serve`` (KV cache woken, caches reset,
  resumed), fed by a producer process on the same GPU sending CUDA-IPC handles of changed weights; then the probe.

vLLM 0.26 (the lent device's) needs the adaptations of ``smoke_vllm_compat.py``; the figures say which ran.
"""

from __future__ import annotations

import asyncio
import os
import time

from smoke_common import Context, Record
from smoke_vllm_model import (
    CUDA_FRACTION,
    LOGPROB_GAP,
    STOP_BUDGET,
    STOP_SEEDS,
    STOP_STRINGS,
    SmokeModel,
    changed_state,
    check_probe,
    forward_logprobs,
    load_reference,
    reference_logits,
    reference_model,
    write_stop_model,
)


def expected_turn(ids: list[int], decode, eos_ids, stops, budget: int) -> tuple:
    """(ids, finish reason, matched stop, text) of a reply with ``stops``, from the free reply ``ids`` of the same
    seed (pure but for ``decode``): cut at the first token that is EOS or completes a stop string (the earliest in
    the text wins), text = the decoding of the kept ids."""
    for n in range(1, min(len(ids), budget) + 1):
        kept = ids[:n]
        if kept[-1] in eos_ids:
            return kept, "eos", None, decode(kept)
        text = decode(kept)
        hits = sorted((text.find(s), s) for s in stops if s in text)
        if hits:
            return kept, "stop", hits[0][1], text
    return ids[:budget], "length", None, decode(ids[:budget])


def _prompts(tokenizer, n: int) -> list[list[int]]:
    return [
        tokenizer.encode(f"Question {i}: which river runs through the old town {i}? ", add_special_tokens=False)
        for i in range(n)
    ]


def _probe_ids(tokenizer) -> list[int]:
    return tokenizer.encode(
        "<search> river of Corvo </search> <information> the river Elsbywater runs north "
        "</information> <answer> Elsbywater </answer>",
        add_special_tokens=False,
    )


# ------------------------------------------------------------------------------------------ generation checks
async def _generate(gen, prompt, params, seed=None):
    """One request on an empty prefix cache: a request whose prompt is cached prefills only its tail, and in bf16
    that shifts its logits by rounding, enough to flip a sampled token now and then; comparisons between two
    requests need both to compute the same way."""
    await gen.engine.reset_prefix_cache()
    return await gen.generate(prompt, params, seed=seed)


async def check_stops(rec: Record, gen, prompts) -> None:
    from rlinf_ext.protocol.generation import SamplingParams

    free_params = SamplingParams(max_new_tokens=STOP_BUDGET, temperature=1.0, stop=[])
    stop_params = free_params.with_updates(stop=list(STOP_STRINGS))
    counts, wrong, excluded_ok, examples = {s: 0 for s in STOP_STRINGS}, [], [], {}
    for i in range(STOP_SEEDS):
        p, seed = prompts[i % len(prompts)], 100 + i
        free = await _generate(gen, p, free_params, seed)
        got = await _generate(gen, p, stop_params, seed)
        want = expected_turn(free.output_ids, gen.decode, gen.eos_ids, STOP_STRINGS, STOP_BUDGET)
        if (got.output_ids, got.finish_reason, got.matched_stop, got.text) != want:
            wrong.append((seed, got.finish_reason, got.matched_stop, got.text, want[1:]))
        if got.finish_reason == "stop" and got.matched_stop in counts:
            counts[got.matched_stop] += 1
            if got.matched_stop not in examples:  # the first of each: the stop string excluded from the text
                examples[got.matched_stop] = got.text
                cut = await _generate(gen, p, stop_params.with_updates(include_stop_str_in_output=False), seed)
                excluded_ok.append(
                    cut.output_ids == got.output_ids
                    and cut.finish_reason == "stop"
                    and cut.text == got.text[: got.text.find(got.matched_stop)]
                )
    rec.figure("stop strings: replies stopped at", f"{counts} of {STOP_SEEDS} seeds ({STOP_BUDGET} tokens at most)")
    for stop, text in examples.items():
        rec.figure(f"stop strings: first reply stopped at {stop}", repr(text[-80:]))
    if wrong:
        rec.figure("stop strings: replies unlike the free reply cut at its first stop", repr(wrong[:3]))
    rec.check(
        "stop strings: every reply = the free reply of its seed cut at the first stop string or EOS (ids, "
        "finish reason, matched stop, text)",
        not wrong,
    )
    rec.check("stop strings: replies stopped at </search> and at </answer>", all(counts.values()))
    rec.check(
        "stop strings: excluded from the text on request (same ids, text cut before the stop)",
        len(excluded_ok) == len(STOP_STRINGS) and all(excluded_ok),
    )


async def check_logprobs(rec: Record, gen, ref, prompts, device: str) -> None:
    import torch

    from rlinf_ext.protocol.generation import SamplingParams

    mean_tol, max_tol = LOGPROB_GAP[device]
    for temperature in (0.7, 1.0):
        params = SamplingParams(max_new_tokens=16, temperature=temperature, stop=[])
        gaps, untempered = [], []
        for i, p in enumerate(prompts[:3]):
            reply = await gen.generate(p, params, seed=200 + i)
            ours = torch.tensor(reply.logprobs)
            gaps.append((ours - forward_logprobs(ref, p, reply.output_ids, temperature)).abs())
            if temperature != 1.0:
                untempered.append((ours - forward_logprobs(ref, p, reply.output_ids, 1.0)).abs())
        gap = torch.cat(gaps)
        rec.figure(
            f"log-probs T={temperature}: |engine - HF forward| mean / max",
            f"{gap.mean():.2e} / {gap.max():.2e} over {gap.numel()} tokens (tolerances {mean_tol:g} / {max_tol:g})",
        )
        rec.check(
            f"log-probs at T={temperature} = log-softmax(HF logits / T) (mean gap <= {mean_tol:g}, max <= {max_tol:g})",
            gap.mean() <= mean_tol and gap.max() <= max_tol,
        )
        if untempered:
            raw = torch.cat(untempered).mean()
            rec.figure(f"log-probs T={temperature}: mean |engine - untempered log-softmax|", f"{raw:.3f}")
            rec.check(
                f"log-probs at T={temperature} are processed, not raw (the untempered values are > 5x "
                "further on average)",
                raw > 5 * max(float(gap.mean()), mean_tol),
            )


async def check_seeds(rec: Record, gen, prompt) -> None:
    from rlinf_ext.protocol.generation import SamplingParams

    params = SamplingParams(max_new_tokens=16, temperature=1.0, stop=[])
    a = await _generate(gen, prompt, params, 11)
    b = await _generate(gen, prompt, params, 11)
    others = [(await _generate(gen, prompt, params, s)).output_ids for s in (12, 13)]
    rec.check("seeds: the same seed gives the same ids (sequential requests)", a.output_ids == b.output_ids)
    rec.check("seeds: other seeds give other ids", all(ids != a.output_ids for ids in others))


async def check_reload(rec: Record, gen, ref, model: SmokeModel, probe: list[int], device: str, seed: int) -> None:
    """The CPU route (vLLM's layerwise in-place reload) with changed weights in three buckets."""
    import torch

    from rlinf_ext.sync.weight_sync import prepare_handles

    if not gen.in_process:  # CPU tensors to the engine's process: shared-memory files, as the actor prepares them
        prepare_handles(torch.device("cpu"))
    old = reference_logits(ref, probe)
    state = changed_state(model, seed)
    items = list(state.items())
    await gen.begin_weight_load()
    try:
        for k in range(3):
            await gen.load_weight_bucket(items[k::3])
    finally:
        await gen.finish_weight_load()
    load_reference(ref, state)
    rec.figure("in-place reload: seconds (3 buckets, pause to resume)", f"{gen.last_load_s:.2f}")
    await check_probe(rec, gen, "in-place reload", reference_logits(ref, probe), old, probe, device)


# ------------------------------------------------------------------------------------------ engines
def engine_options(model: SmokeModel, ctx: Context):
    """The engine as ``generation/vllm_wire.py:options_from_config`` makes it on this device (CUDA: AsyncLLM with
    the collocated placement's sleep mode and ``ipc`` backend, the schema's ``mp`` executor; CPU: in process)."""
    from rlinf_ext.generation.vllm_wire import VLLMEngineOptions, cpu_batched_tokens

    common = dict(model_path=str(model.path), seed=0, enforce_eager=True, max_num_seqs=32)
    if ctx.cuda:
        return VLLMEngineOptions(
            **common,
            dtype="bfloat16",
            in_process=False,
            gpu_memory_utilization=CUDA_FRACTION,
            distributed_executor_backend="mp",
            max_model_len=1024,
            enable_sleep_mode=True,
            weight_transfer_backend="ipc",
            eager_helper_ops=False,
        )
    return VLLMEngineOptions(
        **common,
        dtype="float32",
        in_process=True,
        distributed_executor_backend="uni",
        max_model_len=512,
        kv_cache_memory_bytes=32 << 20,
        enable_chunked_prefill=False,
        max_num_batched_tokens=cpu_batched_tokens(None, 512),
    )


class Phases:
    """Prints each phase's end with the stage's elapsed seconds: on a timeout, the driver's record keeps the tail of
    this output, which then says how far the stage got."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def done(self, name: str) -> None:
        print(f"S8: {name} done at {time.perf_counter() - self.t0:.1f} s", flush=True)


def s8_vllm(rec: Record, ctx: Context) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        from smoke_common import SkipStage

        raise SkipStage(
            "vLLM is not installed here (docs/environment.md, 'vLLM on the lent GPU': "
            "scripts/device_vllm_smoke.sh carries vLLM 0.26 to the lent device)"
        )
    if ctx.cuda:
        # torch.compile off in this process and vLLM's (inherited): the engine is eager, and vLLM's compiled helper
        # ops (log-prob ranks) would wait for a cold inductor build, which is not under test here
        os.environ["TORCH_COMPILE_DISABLE"] = "1"
    asyncio.run(_s8(rec, ctx))


async def _s8(rec: Record, ctx: Context) -> None:
    import torch
    import transformers
    import vllm
    from transformers import AutoTokenizer

    from rlinf_ext.generation.vllm_engine import VLLMGenerator

    rec.figure(
        "versions", f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    cuda = gen = None
    phase = Phases()
    try:
        if ctx.cuda:
            from smoke_vllm_cuda import CudaSide

            cuda = CudaSide(ctx)  # before anything touches CUDA here: the bare context's cost; starts the producer
            phase.done("CUDA context, producer started")
        t = time.perf_counter()
        model = write_stop_model(ctx)
        ref = reference_model(model, ctx)
        rec.figure(
            "model",
            f"random Qwen2, {sum(p.numel() for p in ref.parameters()) / 1e6:.1f}M parameters, "
            f"{str(model.dtype)[6:]}, hidden {model.shape.hidden_size}, "
            f"{model.shape.num_hidden_layers} layers, {model.vocab_rows} vocabulary rows "
            f"({time.perf_counter() - t:.1f} s to build)",
        )
        tokenizer = AutoTokenizer.from_pretrained(str(model.path))
        prompts, probe = _prompts(tokenizer, 4), _probe_ids(tokenizer)
        phase.done("model")
        if cuda is not None:
            cuda.before_engine(rec)
            phase.done("producer's imports")
        gen = VLLMGenerator.start(engine_options(model, ctx), return_logprobs=True)
        if not gen.in_process:  # an AsyncLLM of the installed vLLM (0.26 on the lent GPU): its replies as 0.32's
            from smoke_vllm_compat import EngineCompat

            gen.engine = EngineCompat(gen.engine)
        phase.done("engine start")
        parts = ", ".join(f"{k} {v:.1f}" for k, v in gen.start_parts.items())
        rec.figure(
            "engine start", f"{gen.start_s:.1f} s ({parts}); {'InprocVLLMEngine' if gen.in_process else 'AsyncLLM'}"
        )
        await check_stops(rec, gen, prompts)
        phase.done("stop strings")
        await check_logprobs(rec, gen, ref, prompts, ctx.device)
        await check_seeds(rec, gen, prompts[2])
        phase.done("log-probs, seeds")
        if cuda is None:
            await check_reload(rec, gen, ref, model, probe, ctx.device, seed=1)
            phase.done("in-place reload")
            rec.skip(
                "sleep level 1 and 2, wake_up, memory vs the plan",
                "CUDA only: vLLM's sleep mode needs CUDA's CuMem allocator; the CPU engine has no sleep",
            )
            rec.skip(
                "collocated IPC route from a second process + probe",
                "CUDA only: CUDA-IPC handles and the ipc weight-transfer backend need a CUDA device",
            )
            return
        await cuda.check_sleep(rec, gen, model, prompts[0])  # ends with a level-2 sleep and both wake-ups
        phase.done("sleep levels")
        await check_reload(rec, gen, ref, model, probe, ctx.device, seed=1)  # fills the weights the sleep discarded
        phase.done("in-place reload")
        await cuda.check_ipc(rec, gen, model, ref, probe)
        phase.done("IPC route")
    finally:
        if gen is not None:
            gen.shutdown()
        if cuda is not None:
            cuda.close()
