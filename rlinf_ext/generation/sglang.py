"""SGLang for generation: request/reply translation shared by every SGLang user, and the evaluation engine.

Requests and replies (pure, unit-tested on CPU): ``to_sglang_params`` turns our ``SamplingParams`` fields into
SGLang's ``sampling_params`` (``stop`` included, which RLinf's own worker drops); ``sglang_reply`` turns an
``async_generate`` result into the ``GenerateReply`` every rollout worker sends (decoded ``text``, ``finish_reason``
in stop|eos|length, ``matched_stop``, ``logprobs``). The training worker (``workers/rollout_sglang.py``) and the
evaluation engine below both use them, so their replies mean what ``generation/hf.py``'s do.

``SGLangEngineGenerator`` is a GPU ``Generator`` on SGLang's offline engine, for ``rlinf-ext eval`` with
``rollout.rollout_backend: sglang`` (NOT GPU-verified); no Ray worker group: one in-process ``Engine`` (its
scheduler/detokenizer subprocesses own the GPUs) serves every concurrent ``generate`` call.

- Engine class: RLinf's ``rlinf.workers.rollout.sglang.Engine`` (= ``sglang.Engine`` + RLinf's patches), not
  plain ``sglang.Engine``: sglang 0.4.x returns *either* ``text`` (detokenizing) *or* ``output_ids``; RLinf's
  patched tokenizer/detokenizer managers return both, and we need both (stop strings need detokenization, the
  agent loop needs the exact sampled ids). The same class RLinf's ``SGLangWorker`` runs in training.
- Replies: stop string kept in ``text``, EOS kept in ids and text. Additionally ``stop_token_ids`` = the HF
  generator's EOS set (generation_config + tokenizer), so both engines end a turn on the same tokens;
  ``no_stop_trim`` is always on so SGLang never drops the EOS text, and a stop string the caller asked to exclude
  is cut here, as ``HFGenerator`` does. SGLang checks the token budget before EOS/stop strings, HF after: a turn
  ending on its last allowed token is classified as HF would (``_end_at_budget``). SGLang also always stops at the
  ``eos_token_id`` of the model's config.json (normally part of the HF set anyway).
- GPUs: ONE engine with ``tp_size = rollout.tensor_parallel_size`` and ``dp_size = GPUs // tp_size`` (SGLang's
  own data-parallel controller spreads requests over the replicas). GPUs = the rollout's ranks in
  ``cluster.component_placement`` (``all`` = ``cluster.num_gpus_per_node``), on this node, from ``base_gpu_id``.
- Sampling: the engine's ``random_seed`` = ``runner.seed``; no per-request seeds (evaluation is greedy).
- An engine serves ONE event loop (SGLang binds its handle loop to the loop of the first request): build a
  generator per ``run_evaluation`` call, and ``close()`` it (``engine.shutdown()``) when done.

sglang itself is imported only inside the functions that start an engine (``import_rlinf_sglang``): it is a GPU
extra, and importing it initialises CUDA.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoTokenizer, GenerationConfig

from rlinf_ext.config.placement import placement_entries
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.generation.hf import eos_token_ids
from rlinf_ext.models.dtypes import PRECISIONS, hf_name_of_precision
from rlinf_ext.protocol.generation import GenerateReply, GenerationResult, SamplingParams

GPU_INSTALL_FIX = "pip install -e '.[gpu]' (sglang==0.4.6.post5, RLinf's pin)"


class SGLangUnavailable(RuntimeError):
    """SGLang cannot run here (no CUDA device, not installed, or a config it cannot serve); names the fix."""


def import_rlinf_sglang(module: str, name: str, alternative: str = ""):
    """``from <module> import <name>`` for RLinf's SGLang wrappers, with one clear error when SGLang is unusable."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, ValueError) as exc:  # RLinf raises ValueError when sglang is missing or the wrong version
        raise SGLangUnavailable(
            f"SGLang is not usable here ({type(exc).__name__}: {exc}). Fix: on the GPU node, {GPU_INSTALL_FIX}"
            + (f"; or {alternative}." if alternative else ".")
        ) from exc


# ----------------------------------------------------------------------------------- requests and replies (pure)
def to_sglang_params(params: dict[str, Any], default_stop: list[str] | None = None) -> dict[str, Any]:
    """Our request ``sampling_params`` -> SGLang ``sampling_params`` (pure; unit-tested on CPU)."""
    out: dict[str, Any] = {}
    if "max_new_tokens" in params:
        out["max_new_tokens"] = int(params["max_new_tokens"])
    greedy = params.get("do_sample") is False
    out["temperature"] = 0.0 if greedy else float(params.get("temperature", 1.0))
    if not greedy:
        if "top_p" in params:
            out["top_p"] = float(params["top_p"])
        if "top_k" in params:
            out["top_k"] = int(params["top_k"]) if int(params["top_k"]) > 0 else -1
    if "repetition_penalty" in params:
        out["repetition_penalty"] = float(params["repetition_penalty"])
    # keep <|im_end|> & co in SGLang's text, as the HF worker's decode does (SGLang skips them by default)
    out["skip_special_tokens"] = False
    stop = list(params.get("stop") or default_stop or [])
    if stop:
        out["stop"] = stop
        # SGLang trims the matched stop string unless told not to; the agent loop keeps it (protocol/generation.py)
        out["no_stop_trim"] = bool(params.get("include_stop_str_in_output", True))
    return out


def sglang_reply(
    result: dict[str, Any],
    decode: Callable[[list[int]], str],
    *,
    include_stop_str_in_output: bool = True,
    return_logprobs: bool = False,
) -> GenerateReply:
    """One SGLang ``async_generate`` result -> the generate reply the agent loop reads (pure).

    Same keys and meanings as the CPU worker's ``reply_of``. SGLang's ``meta_info.finish_reason`` is
    ``{"type": "stop", "matched": "</search>"}`` for a stop string, ``{"type": "stop", "matched": <token id>}``
    for EOS, ``{"type": "length", ...}`` at the budget and ``{"type": "abort", "message": ...}`` on failure.
    ``text`` exists only when the engine detokenizes (``rollout.detokenize``); otherwise ``decode(output_ids)``.
    """
    meta = result.get("meta_info") or {}
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else finish
    matched = finish.get("matched") if isinstance(finish, dict) else None
    if kind == "abort":
        message = finish.get("message") if isinstance(finish, dict) else None
        return {"error": f"SGLang aborted the request: {message or finish}"}
    output_ids = [int(t) for t in result["output_ids"]]
    if kind == "length":
        reason, stop = "length", None
    elif kind == "stop" and isinstance(matched, str):
        reason, stop = "stop", matched
    else:  # a matched token id (EOS or a stop token) ends the turn like EOS
        reason, stop = "eos", None
    text = result.get("text")
    if not isinstance(text, str):
        text = decode(output_ids)
        if stop is not None and not include_stop_str_in_output and stop in text:
            text = text[: text.rfind(stop)]  # what SGLang's own detokenizer does without no_stop_trim
    reply: GenerateReply = {
        "output_ids": output_ids,
        "text": text,
        "finish_reason": reason,
        "matched_stop": stop,
        "logprobs": None,
        "num_generated": len(output_ids),
    }
    if return_logprobs:
        reply["logprobs"] = [float(item[0]) for item in meta["output_token_logprobs"]]
    return reply


# ----------------------------------------------------------------------------------- the evaluation engine


def usable_gpus(cfg: ExperimentConfig, visible: int) -> list[int]:
    """The GPUs of this node the evaluation engine runs on: the ranks ``cluster.component_placement`` gives the
    rollout (``all`` = ``cluster.num_gpus_per_node``); all must be on this node and visible (pure)."""
    per_node = int(cfg.cluster.num_gpus_per_node)
    if per_node < 1:
        raise SGLangUnavailable("cluster.num_gpus_per_node=0 (a CPU cluster). Fix: use a GPU cluster profile.")
    entry = next((e for e in placement_entries(cfg.cluster.component_placement, per_node) if "rollout" in e.components),
                 None)  # ranks are read against one node: evaluation runs on this node only
    if entry is None:
        raise SGLangUnavailable("cluster.component_placement has no rollout entry. Fix: add e.g. `rollout: all`.")
    if entry.error is not None:
        raise SGLangUnavailable(f"cluster.component_placement.{entry.key} (evaluation runs on one node): {entry.error}")
    gpus = list(entry.ranks)
    if gpus[-1] >= visible:
        raise SGLangUnavailable(
            f"cluster.component_placement places the rollout on GPUs {gpus[0]}-{gpus[-1]}, but only "
            f"{visible} CUDA device(s) are visible here. Fix: set cluster.num_gpus_per_node={visible} (or give "
            "rollout ranks within the visible devices), or check CUDA_VISIBLE_DEVICES."
        )
    return gpus


def engine_kwargs(cfg: ExperimentConfig, gpus: list[int]) -> dict[str, Any]:
    """``Engine(**kwargs)`` for evaluating ``rollout.model.model_path`` on the contiguous GPU ids ``gpus`` (pure)."""
    rollout = cfg.rollout
    num_gpus = len(gpus)
    tp = int(rollout.tensor_parallel_size)
    if int(rollout.pipeline_parallel_size) != 1:
        raise SGLangUnavailable(
            f"rollout.pipeline_parallel_size={rollout.pipeline_parallel_size}: SGLang 0.4.6 has no pipeline "
            "parallelism. Fix: set rollout.pipeline_parallel_size=1 (use rollout.tensor_parallel_size instead)."
        )
    if tp < 1 or num_gpus < tp:
        raise SGLangUnavailable(
            f"rollout.tensor_parallel_size={tp} needs {tp} GPU(s) per engine, but {num_gpus} are usable here. "
            "Fix: lower rollout.tensor_parallel_size or run on a node with more GPUs."
        )
    precision = str(rollout.model.precision)
    if precision not in PRECISIONS:
        raise SGLangUnavailable(f"rollout.model.precision={precision!r}: use one of {list(PRECISIONS)}.")
    max_running = int(rollout.max_running_requests)
    return {
        "model_path": str(rollout.model.model_path),
        "tp_size": tp,
        "dp_size": num_gpus // tp,  # GPUs beyond a multiple of tp_size stay idle
        "base_gpu_id": int(gpus[0]),  # engine replicas take GPUs base_gpu_id, base_gpu_id + 1, ...
        "mem_fraction_static": float(rollout.gpu_memory_utilization),
        "dtype": hf_name_of_precision(precision),
        "skip_tokenizer_init": False,  # stop strings need SGLang's detokenizer (rollout.detokenize is implied)
        "random_seed": int(cfg.runner.seed),
        "max_running_requests": max_running,
        "disable_cuda_graph": bool(rollout.enforce_eager),
        "cuda_graph_max_bs": min(int(rollout.cuda_graph_max_bs), max_running),
        "attention_backend": str(rollout.sglang.attention_backend),
        "enable_torch_compile": bool(rollout.sglang.use_torch_compile),
        "torch_compile_max_bs": min(int(rollout.sglang.torch_compile_max_bs), max_running),
        "decode_log_interval": int(rollout.sglang.decode_log_interval),
        "log_level": "warning",  # keep the evaluation's progress bar readable
    }


def sglang_installed() -> bool:
    """Whether sglang can be found, without importing it (importing it initialises CUDA)."""
    return importlib.util.find_spec("sglang") is not None


def load_engine_class() -> Callable[..., Any]:
    """RLinf's patched SGLang ``Engine`` (see the module docstring); a clear error when SGLang is unusable."""
    return import_rlinf_sglang("rlinf.workers.rollout.sglang", "Engine",
                               "set rollout.rollout_backend=hf to evaluate on CPU")


class SGLangEngineGenerator:
    """`await gen.generate(prompt_ids, SamplingParams) -> GenerationResult` on one SGLang engine.

    ``engine``: anything with ``async_generate(input_ids=, sampling_params=, return_logprob=)`` returning SGLang's
    result dict, and ``shutdown()`` (tests pass a fake). ``decode`` turns ids into text when the engine returns no
    ``text``. ``eos_ids`` end a turn as EOS (``stop_token_ids``). ``default_stop``: stop strings for requests
    that bring none (``algorithm.sampling_params.stop``).
    """

    def __init__(
        self,
        engine: Any,
        decode: Callable[[list[int]], str],
        *,
        eos_ids: set[int] | list[int] | tuple[int, ...] = (),
        default_stop: list[str] | None = None,
        return_logprobs: bool = False,
    ):
        self.engine = engine
        self.decode = decode
        self.eos_ids = sorted(int(i) for i in eos_ids)
        self.default_stop = list(default_stop or [])
        self.return_logprobs = return_logprobs

    @classmethod
    def from_config(
        cls,
        cfg: ExperimentConfig,
        *,
        gpus: list[int] | None = None,
        engine_factory: Callable[..., Any] | None = None,
    ) -> SGLangEngineGenerator:
        """Start the engine for ``cfg.rollout`` (blocks until SGLang has loaded the model).

        ``gpus``: None = the rollout's GPUs from ``cluster.component_placement`` (``usable_gpus``).
        ``engine_factory``: None = RLinf's patched SGLang ``Engine``.
        """
        if gpus is None:
            gpus = usable_gpus(cfg, torch.cuda.device_count())
        kwargs = engine_kwargs(cfg, gpus)
        factory = engine_factory if engine_factory is not None else load_engine_class()
        model_path = kwargs["model_path"]
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        try:
            generation_config = GenerationConfig.from_pretrained(model_path)
        except OSError:  # no generation_config.json: the tokenizer's EOS alone
            generation_config = None
        # the same EOS set as the HF engine (generation_config + tokenizer), so both end turns on the same tokens
        eos_ids = eos_token_ids(generation_config, tokenizer)
        print(f"[sglang] starting the engine: tp_size={kwargs['tp_size']} dp_size={kwargs['dp_size']} "
              f"on GPUs {gpus[0]}-{gpus[-1]}, model {model_path}", flush=True)
        engine = factory(**kwargs)
        return cls(
            engine,
            lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            eos_ids=eos_ids,
            default_stop=list(cfg.algorithm.sampling_params.stop or []),
            return_logprobs=bool(cfg.rollout.return_logprobs),
        )

    def sglang_params(self, sampling_params: SamplingParams) -> dict[str, Any]:
        """The ``sampling_params`` dict sent to SGLang for one request (pure)."""
        params = to_sglang_params(dataclasses.asdict(sampling_params), self.default_stop)
        params["no_stop_trim"] = True  # keep EOS text too (HF keeps it); an excluded stop string is cut in generate
        if self.eos_ids:
            params["stop_token_ids"] = list(self.eos_ids)
        return params

    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams) -> GenerationResult:
        if self.engine is None:
            raise RuntimeError("SGLangEngineGenerator.generate after close(): build a new generator")
        if not prompt_ids:
            raise ValueError("generate needs a non-empty prompt")
        if sampling_params.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {sampling_params.max_new_tokens}")
        result = await self.engine.async_generate(
            input_ids=list(prompt_ids), sampling_params=self.sglang_params(sampling_params),
            return_logprob=self.return_logprobs,
        )
        reply = sglang_reply(result, self.decode, include_stop_str_in_output=True,
                             return_logprobs=self.return_logprobs)
        if "error" in reply:
            raise RuntimeError(f"SGLang failed to generate: {reply['error']}")
        reason, text, stop = reply["finish_reason"], reply["text"], reply["matched_stop"]
        if reason == "length":
            reason, stop = self._end_at_budget(reply["output_ids"], sampling_params.stop or self.default_stop)
        if stop is not None and not sampling_params.include_stop_str_in_output and stop in text:
            text = text[: text.rfind(stop)]  # as HFGenerator: ids keep every sampled token, the text drops the stop
        return GenerationResult(
            output_ids=reply["output_ids"],
            text=text,
            finish_reason=reason,
            matched_stop=stop,
            logprobs=reply["logprobs"],
            num_generated=None,  # = len(output_ids): SGLang never samples past the end (as HFGenerator)
        )

    def _end_at_budget(self, ids: list[int], stops: list[str]) -> tuple[str, str | None]:
        """Finish reason when SGLang says ``length``. SGLang checks the budget before EOS and stop strings, HF
        after: a turn whose LAST allowed token is EOS or completes a stop string is ``eos``/``stop`` for
        ``HFGenerator``, so it is here too (same tail test as ``HFGenerator._cut``)."""
        if ids and ids[-1] in self.eos_ids:
            return "eos", None
        longest = max((len(s) for s in stops), default=0)
        if ids and longest:
            tail = self.decode(ids[max(0, len(ids) - longest - 4):])
            hits = [s for s in stops if s in tail]
            if hits:
                return "stop", min(hits, key=tail.rfind)
        return "length", None

    def close(self) -> None:
        """Shut the engine down (its GPU subprocesses exit); safe to call twice."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()

    def __enter__(self) -> SGLangEngineGenerator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
