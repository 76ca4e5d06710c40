"""SGLang 0.5.23's request and reply, shared by the rollout worker and the evaluation engines (pure but for
``hf_eos_ids``; unit-tested on CPU with replies in 0.5.23's shapes).

Read from sglang 0.5.23's sources (``sglang/srt/managers/tokenizer_manager.py``, ``schedule_batch.py``,
``sampling_params.py``):
- Request: ``Engine.async_generate(input_ids=[...], sampling_params={...}, return_logprob=...)``; nothing is
  re-tokenised for a text prompt. ``to_sglang_params`` = ``turn_end.engine_sampling`` in SGLang's names, with
  ``no_stop_trim`` (the matched stop string and EOS stay in the text, as vLLM's ``include_stop_str_in_output``)
  and ``skip_special_tokens=False`` (as the HF decode).
- Reply (non-streaming, one request): ``{"text": ..., "output_ids": [...], "meta_info": {...}}``; the scheduler
  sends ``output_ids`` through the stop position whether or not the engine detokenizes (no ``text`` with
  ``skip_tokenizer_init``). ``meta_info["finish_reason"]`` is ``{"type": "stop", "matched": "</search>"}`` (stop
  string), ``{"type": "stop", "matched": <id>}`` (EOS / a stop id), ``{"type": "length", "length": n}`` or
  ``{"type": "abort", "message": ...}``; with ``return_logprob`` ``meta_info["output_token_logprobs"]`` holds one
  ``(logprob, token_id, text|None)`` per output id. 0.5.23 checks stop strings, then EOS, then the budget at
  every token (``Req.update_finish_state``).
- ``result_of_sglang`` reads that reply as every engine's ``GenerationResult`` (``turn_end``, the text = the HF
  tokenizer's decoding of the kept ids, as for vLLM); the sampled ids must equal the log-prob entries' ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rlinf_ext.generation.turn_end import engine_finish, engine_sampling, turn_end
from rlinf_ext.protocol.generation import GenerationResult, SamplingParams

# meta_info keys of an SGLang 0.5.23 reply
FINISH_REASON = "finish_reason"
OUTPUT_TOKEN_LOGPROBS = "output_token_logprobs"
INPUT_TOKEN_LOGPROBS = "input_token_logprobs"


def to_sglang_params(params: SamplingParams, eos_ids: Iterable[int]) -> dict[str, Any]:
    """SGLang's ``sampling_params`` of one request (pure): greedy = temperature 0 (SGLang then samples with
    top-k 1), top-k off = -1, ``stop_token_ids`` = the HF EOS set (SGLang also stops at config.json's EOS)."""
    shared = engine_sampling(params, eos_ids)
    out: dict[str, Any] = {
        "max_new_tokens": shared.max_new_tokens,
        "temperature": shared.temperature,
        "top_p": shared.top_p,
        "top_k": shared.top_k if shared.top_k > 0 else -1,
        "repetition_penalty": shared.repetition_penalty,
        "stop_token_ids": shared.stop_token_ids,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if shared.stop:
        out["stop"] = shared.stop
    return out


def result_of_sglang(
    result: dict[str, Any],
    decode: Callable[[list[int]], str],
    params: SamplingParams,
    eos_ids: Iterable[int],
    *,
    return_logprobs: bool = False,
) -> GenerationResult:
    """One ``async_generate`` reply for a request with ``params`` -> ``GenerationResult`` (pure but for
    ``decode``). An aborted request, or log-probs that do not belong to the returned ids, raise."""
    meta = result.get("meta_info") or {}
    finish = meta.get(FINISH_REASON)
    if not isinstance(finish, dict):
        raise RuntimeError(f"SGLang returned no finish reason for a finished request (meta_info={meta!r})")
    if finish.get("type") == "abort":
        raise RuntimeError(f"SGLang aborted the request: {finish.get('message') or finish}")
    reason, stop = engine_finish(finish.get("type"), finish.get("matched"), "SGLang")
    ids = [int(t) for t in result["output_ids"]]
    logprobs = None
    if return_logprobs:
        entries = meta.get(OUTPUT_TOKEN_LOGPROBS)
        if entries is None or [int(e[1]) for e in entries] != ids:
            raise RuntimeError(
                f"SGLang's output log-probs do not match its {len(ids)} output ids "
                f"({'none returned' if entries is None else f'{len(entries)} entries'}); the request needs "
                "return_logprob=True"
            )
        logprobs = [float(e[0]) for e in entries]
    end = turn_end(
        ids,
        decode,
        eos_ids=set(int(i) for i in eos_ids),
        stop=params.stop,
        max_new_tokens=params.max_new_tokens,
        include_stop_str_in_output=params.include_stop_str_in_output,
        engine_reason=reason,
        engine_stop=stop,
    )
    return GenerationResult(
        output_ids=end.output_ids,
        text=end.text,
        finish_reason=end.finish_reason,
        matched_stop=end.matched_stop,
        logprobs=None if logprobs is None else logprobs[: len(end.output_ids)],
    )


def hf_eos_ids(model_path: str, tokenizer: Any = None) -> list[int]:
    """The EOS set the HF engine ends a turn on (generation_config + tokenizer), for ``stop_token_ids``."""
    # heavy: transformers loads in the engine's process only (the launcher imports this module's wire helpers)
    from transformers import AutoTokenizer, GenerationConfig

    from rlinf_ext.generation.hf import eos_token_ids  # lazy: imports transformers (see above)

    tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_path)
    try:
        generation_config = GenerationConfig.from_pretrained(model_path)
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        generation_config = None
    return sorted(eos_token_ids(generation_config, tokenizer))
