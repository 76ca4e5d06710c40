"""What goes into and comes out of a vLLM 0.32 engine, as pure functions: the engine's start options
(``VLLMEngineOptions`` -> ``EngineArgs`` keywords, and the environment its start needs), one request's
``vllm.SamplingParams`` keywords, and one ``CompletionOutput`` as a ``GenerationResult`` meaning exactly what
``generation/hf.py``'s replies mean. The engines that take them: ``generation/vllm_engine.py``.

- Requests: ``{"prompt_token_ids": ...}`` (nothing is re-tokenised), stop strings checked by the engine
  (``include_stop_str_in_output``: the ids keep the stop string's tokens), ``stop_token_ids`` = the HF EOS set
  (``generation/hf.py:eos_token_ids``), a per-request ``seed``, ``logprobs=0`` (the sampled token's log-prob),
  ``output_kind=FINAL_ONLY``.
- Log-probs mean what the actor recomputes as the old log-probs (``training/logprobs.py``: log-softmax of
  logits / temperature) and what ``generation/hf.py`` returns: the engine runs with
  ``logprobs_mode="processed_logprobs"`` (vLLM's default ``raw_logprobs`` is taken before temperature scaling, so
  at temperature 0.7 it would differ from the actor's). vLLM's processed values also follow top-k / top-p /
  penalties; ``validate`` refuses ``rollout.return_logprobs`` with those on (``config/rules/generation.py``).
- Replies: the turn's end is ``generation/turn_end.py``'s, told what vLLM decided (vLLM checks EOS and stop ids
  before the token budget, stop strings after it: a stop string completed by the last allowed token is
  classified ``stop`` as on every engine); the text is the HF tokenizer's decoding of the kept ids. The weight
  version is vLLM's own label of the weights that sampled the tokens (``CompletionOutput.weight_versions``, the
  engine's ``update_weight_version``): usually one per call, as a sync pauses in wait mode, but one per token when
  a sync passed the call (``weight_version_of``): a request preempted for KV space, or every turn in flight when
  the sync pauses in keep mode (``runner.partial_rollout``). vLLM 0.26 has no labels (no ``weight_versions``): none.
- Start: on CPU the engine runs in process (``InprocVLLMEngine``), on GPUs as ``AsyncLLM`` with the placement's
  weight-transfer backend (``ipc`` collocated with sleep mode, ``nccl`` disaggregated:
  ``sync/vllm_transfer.py:transfer_backend``); ``engine_environment`` is what that start sets in the process
  environment (the engine-core process inherits it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

from rlinf_ext.generation.turn_end import engine_finish, engine_sampling, turn_end
from rlinf_ext.models.dtypes import hf_name_of_precision
from rlinf_ext.protocol.generation import FinishReason, GenerationResult, SamplingParams, WeightVersion
from rlinf_ext.sync.vllm_transfer import transfer_backend

# vLLM resolves it by its qualified name in every worker (``worker_extension_cls``)
WORKER_EXTENSION = "rlinf_ext.generation.vllm_engine.WeightLoadExtension"
# the sampled token's log-prob after temperature scaling, as the actor computes it (vllm/config/model.py)
LOGPROBS_MODE = "processed_logprobs"
# vLLM's engine-core client msgpack-encodes every call it sends to the engine-core process
# (vllm/v1/engine/core_client.py, ``_call_utility_async``), and vllm/v1/serial_utils.py's ``MsgpackEncoder``
# refuses any object it has no msgpack form for unless this is set (then it pickles them). The ``ipc`` backend's
# update info is made of such objects: torch's CUDA-IPC rebuild arguments (``reduce_tensor``) hold the tensor and
# storage classes and a dtype. The socket is the engine's own (this process to its engine-core child), as with
# vLLM's HTTP route to the same engine, which needs the same variable (vllm/distributed/weight_transfer/clients.py).
ALLOW_PICKLED_CALLS_ENV = "VLLM_ALLOW_INSECURE_SERIALIZATION"


# ------------------------------------------------------------------------------------------------ options (pure)
@dataclass
class VLLMEngineOptions:
    """What starts one engine; ``engine_args`` turns it into ``AsyncEngineArgs``/``EngineArgs`` keywords."""

    model_path: str
    tokenizer_path: str | None = None
    dtype: str = "float32"  # Hugging Face spelling (float32, bfloat16, float16)
    seed: int = 0
    in_process: bool = True  # InprocVLLMEngine (CPU, CI); False = AsyncLLM (engine core in its own process)
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.65
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = "uni"
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_seqs: int = 128
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    kv_cache_memory_bytes: int | None = None  # CPU: vLLM reserves VLLM_CPU_KVCACHE_SPACE otherwise
    attention_backend: str | None = None  # None = vLLM's choice (CPU has one)
    enable_sleep_mode: bool = False  # GPU collocated route
    eager_helper_ops: bool = True  # in process: vLLM's torch.compile'd helper ops run eager (InprocVLLMEngine)
    weight_transfer_backend: Literal["ipc", "nccl"] | None = None  # GPU routes
    # "priority" when batches are rolled out ahead (runner.max_staleness > 0): each request's ``priority`` (its
    # batch's dispatch index) then orders vLLM's waiting queue, lowest first; "fcfs" ignores it
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    extra: dict[str, Any] = field(default_factory=dict)


def engine_args(options: VLLMEngineOptions) -> dict[str, Any]:
    """``EngineArgs`` keywords of ``options`` (pure)."""
    kwargs: dict[str, Any] = dict(
        model=str(options.model_path),
        tokenizer=str(options.tokenizer_path or options.model_path),
        dtype=options.dtype,
        seed=int(options.seed),
        enforce_eager=bool(options.enforce_eager),
        gpu_memory_utilization=float(options.gpu_memory_utilization),
        tensor_parallel_size=int(options.tensor_parallel_size),
        enable_prefix_caching=bool(options.enable_prefix_caching),
        enable_chunked_prefill=bool(options.enable_chunked_prefill),
        max_num_seqs=int(options.max_num_seqs),
        worker_extension_cls=WORKER_EXTENSION,
        disable_log_stats=True,
        logprobs_mode=LOGPROBS_MODE,
    )
    if options.distributed_executor_backend:
        kwargs["distributed_executor_backend"] = options.distributed_executor_backend
    for key in ("max_num_batched_tokens", "max_model_len", "kv_cache_memory_bytes", "attention_backend"):
        value = getattr(options, key)
        if value is not None:
            kwargs[key] = value
    if options.enable_sleep_mode:
        kwargs["enable_sleep_mode"] = True
    if options.weight_transfer_backend:
        kwargs["weight_transfer_config"] = {"backend": options.weight_transfer_backend}
    if options.scheduling_policy != "fcfs":
        kwargs["scheduling_policy"] = options.scheduling_policy
    kwargs.update(options.extra)
    return kwargs


def engine_environment(options: VLLMEngineOptions) -> dict[str, str]:
    """The process environment an ``AsyncLLM`` of ``options`` needs before it starts (pure): with the ``ipc``
    backend, ``ALLOW_PICKLED_CALLS_ENV`` (read by the encoder here and by the decoder in the engine-core process,
    which caches vLLM's variables when it starts)."""
    return {ALLOW_PICKLED_CALLS_ENV: "1"} if options.weight_transfer_backend == "ipc" else {}


CPU_KV_CACHE_BYTES = 512 << 20
# CPU: no chunked prefill (vLLM 0.32's CPU model runner raises "CPU Generator does not use offset" when a seeded
# request is prefilled in parts), so a step's token budget must hold whole prompts: at least this, and the context
CPU_MIN_BATCHED_TOKENS = 8192


def cpu_batched_tokens(configured: int | None, seq_length: int) -> int:
    """The CPU engine's token budget per step without chunked prefill (pure): the configured budget, raised to a
    whole context and to ``CPU_MIN_BATCHED_TOKENS``."""
    return max(int(configured or 0), int(seq_length), CPU_MIN_BATCHED_TOKENS)


def options_from_config(cfg: Any, rank: int = 0, *, cuda: bool | None = None) -> VLLMEngineOptions:
    """The engine of ``cfg.rollout`` (``rollout.model``, ``rollout.*`` engine keys, ``rollout.vllm``).

    dtype = ``rollout.model.precision``; on CPU (``cuda`` False, the default without a CUDA device) the engine
    runs in process and eager with the ``uni`` executor, vLLM's CPU attention and ``rollout.vllm``'s
    ``kv_cache_memory_bytes``; on GPUs ``AsyncLLM`` with the config's executor, attention backend, CUDA graphs
    unless ``enforce_eager``, and the weight-transfer backend of the placement (``ipc`` collocated, with sleep
    mode; ``nccl`` disaggregated: ``sync/vllm_transfer.py:transfer_backend``)."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    rollout = cfg.rollout
    vcfg = rollout.vllm
    backend = transfer_backend(cfg, cuda)
    in_process = getattr(vcfg, "in_process", None)
    in_process = (not cuda) if in_process is None else bool(in_process)
    return VLLMEngineOptions(
        model_path=str(rollout.model.model_path),
        dtype=hf_name_of_precision(str(rollout.model.precision), "rollout.model.precision"),
        seed=int(cfg.runner.seed) + int(rank),
        in_process=in_process,
        enforce_eager=True if not cuda else bool(rollout.enforce_eager),
        gpu_memory_utilization=float(rollout.gpu_memory_utilization),
        tensor_parallel_size=int(rollout.tensor_parallel_size),
        distributed_executor_backend="uni" if (in_process or not cuda) else str(rollout.distributed_executor_backend),
        enable_prefix_caching=bool(vcfg.enable_prefix_caching),
        enable_chunked_prefill=bool(vcfg.enable_chunked_prefill) if cuda else False,
        max_num_seqs=int(rollout.max_running_requests),
        max_num_batched_tokens=vcfg.max_num_batched_tokens
        if cuda
        else cpu_batched_tokens(vcfg.max_num_batched_tokens, cfg.runner.seq_length),
        kv_cache_memory_bytes=(vcfg.kv_cache_memory_bytes or CPU_KV_CACHE_BYTES)
        if not cuda
        else vcfg.kv_cache_memory_bytes,
        max_model_len=int(cfg.runner.seq_length),
        attention_backend=str(vcfg.attention_backend) if cuda and vcfg.attention_backend else None,
        enable_sleep_mode=backend == "ipc",  # only a collocated engine sleeps (CuMem allocator)
        eager_helper_ops=not cuda,
        weight_transfer_backend=backend,
        scheduling_policy="priority" if int(cfg.runner.max_staleness) > 0 else "fcfs",
    )


# ------------------------------------------------------------------------------------------------ wire (pure)
def to_vllm_params(
    params: SamplingParams, eos_ids: Iterable[int], *, seed: int | None = None, return_logprobs: bool = False
) -> dict[str, Any]:
    """``vllm.SamplingParams`` keywords of one request (pure): ``turn_end.engine_sampling`` in vLLM's names;
    ``skip_special_tokens=False`` as the HF decode; stop strings always kept in the output (``turn_end`` cuts the
    text when the caller excludes them, as for HF)."""
    shared = engine_sampling(params, eos_ids)
    out: dict[str, Any] = dict(
        max_tokens=shared.max_new_tokens,
        temperature=shared.temperature,
        top_p=shared.top_p,
        top_k=shared.top_k,
        repetition_penalty=shared.repetition_penalty,
        stop=shared.stop,
        stop_token_ids=shared.stop_token_ids,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        ignore_eos=False,
        detokenize=bool(shared.stop),  # stop strings need the engine's incremental detokenizer
    )
    if seed is not None:
        out["seed"] = int(seed)
    if return_logprobs:
        out["logprobs"] = 0
    return out


def engine_reason(finish_reason: str | None, stop_reason: int | str | None) -> tuple[FinishReason, str | None]:
    """vLLM's ``finish_reason``/``stop_reason`` -> ``turn_end``'s ``engine_reason``/``engine_stop`` (pure; the
    shared reading, ``turn_end.engine_finish``): ``stop`` with a string = a stop string, ``stop`` with an id or
    None = EOS, ``length`` = the budget."""
    return engine_finish(finish_reason, stop_reason, "vLLM")


UNLABELLED_WEIGHTS = "default"  # vLLM's label of weights no update named (vllm/v1/engine/core.py)


def weight_version_of(spans: Any, num_tokens: int) -> WeightVersion:
    """vLLM's weight-version spans of one output's ``num_tokens`` tokens (``vllm.outputs.WeightVersionSpan``: the
    label of the weights that sampled output tokens [start, end)) as the ``GenerationResult.weight_version`` of the
    call (pure): one label is the call's version; several give each token its own. ``pause_generation(mode="wait")``
    does not wait for a request vLLM preempted for KV space: it resumes on the new weights, so its tokens span two
    versions, and each token's engine log-prob is that token's own behaviour log-prob. None when any token's
    weights carry no label of ours (vLLM's "default") or there are no spans (vLLM 0.26 has none)."""
    spans = list(spans or ())
    labels = {span.version for span in spans}
    if not spans or UNLABELLED_WEIGHTS in labels:
        return None
    if len(labels) == 1:
        return int(spans[0].version)
    bounds = [(int(span.start), int(span.end)) for span in spans]
    if bounds[0][0] != 0 or bounds[-1][1] != num_tokens or any(a[1] != b[0] for a, b in pairwise(bounds)):
        covered = " + ".join(f"[{a}, {b})" for a, b in bounds)
        raise ValueError(
            f"vLLM's weight-version spans cover tokens {covered} of {num_tokens}: they must tile the "
            "output tokens from 0 (vllm/v1/engine/output_processor.py builds them so)"
        )
    return [int(span.version) for span in spans for _ in range(span.start, span.end)]


def result_of_output(
    output: Any, decode, params: SamplingParams, eos_ids: Iterable[int], return_logprobs: bool = False
) -> GenerationResult:
    """One ``vllm.CompletionOutput`` -> ``GenerationResult`` (pure but for ``decode``)."""
    ids = [int(t) for t in output.token_ids]
    reason, stop = engine_reason(output.finish_reason, output.stop_reason)
    end = turn_end(
        ids,
        decode,
        eos_ids=set(eos_ids),
        stop=params.stop,
        max_new_tokens=params.max_new_tokens,
        include_stop_str_in_output=params.include_stop_str_in_output,
        engine_reason=reason,
        engine_stop=stop,
    )
    logprobs = None
    if return_logprobs and output.logprobs is not None:
        logprobs = [float(step[tok].logprob) for tok, step in zip(ids, output.logprobs)][: len(end.output_ids)]
    # vLLM 0.26's CompletionOutput has no ``weight_versions``: read as unlabelled
    version = weight_version_of(getattr(output, "weight_versions", None), len(ids))
    if isinstance(version, list):  # the versions follow the kept ids; one left is the call's one version
        version = version[: len(end.output_ids)]
        version = version[0] if len(set(version)) == 1 else version
    return GenerationResult(
        output_ids=end.output_ids,
        text=end.text,
        finish_reason=end.finish_reason,
        matched_stop=end.matched_stop,
        logprobs=logprobs,
        weight_version=version,
    )


def check_generate_args(prompt_ids: list[int], sampling_params: SamplingParams) -> None:
    """What every vLLM generate call refuses before it reaches the engine."""
    if not prompt_ids:
        raise ValueError("generate needs a non-empty prompt")
    if sampling_params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {sampling_params.max_new_tokens}")


__all__ = [
    "VLLMEngineOptions",
    "engine_args",
    "engine_environment",
    "options_from_config",
    "to_vllm_params",
    "engine_reason",
    "result_of_output",
    "weight_version_of",
    "check_generate_args",
]
