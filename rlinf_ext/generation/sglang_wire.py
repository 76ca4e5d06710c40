"""SGLang's wire format, shared by every SGLang user (pure but for ``hf_eos_ids``; unit-tested on CPU).

``to_sglang_params`` turns our ``SamplingParams`` fields into SGLang's ``sampling_params`` (``stop`` included,
which RLinf's own worker drops; ``stop_token_ids`` = the HF EOS set); ``sglang_reply`` turns an
``async_generate`` result into the ``GenerateReply`` every rollout worker sends (decoded ``text``,
``finish_reason`` in stop|eos|length, ``matched_stop``, ``logprobs``). The training worker
(``workers/rollout_sglang.py``) and the evaluation engines (``generation/sglang_engine.py``) both use them, so
their replies mean what ``generation/hf.py``'s do.

- Replies: stop string kept in ``text`` unless excluded, EOS kept in ids and text; ``stop_token_ids`` = the HF
  generator's EOS set (generation_config + tokenizer), so both engines end a turn on the same tokens. SGLang
  checks the token budget before EOS/stop strings, HF after: ``generation/turn_end.py`` classifies a turn
  ending on its last allowed token the same for both. SGLang also always stops at config.json's ``eos_token_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from transformers import AutoTokenizer, GenerationConfig

from rlinf_ext.generation.hf import eos_token_ids
from rlinf_ext.generation.turn_end import turn_end
from rlinf_ext.protocol.generation import GenerateReply, SamplingParams


def to_sglang_params(params: dict[str, Any], eos_ids: list[int] | tuple[int, ...] = ()) -> dict[str, Any]:
    """Our request ``sampling_params`` -> SGLang ``sampling_params`` (pure; unit-tested on CPU).

    Only the keys the request names are sent (SGLang's own defaults, or the config's merged in by the caller,
    stay for the rest): a request without ``temperature`` keeps the configured one; ``stop`` is the request's.
    ``eos_ids`` become ``stop_token_ids``, so SGLang ends a turn on every EOS id the HF engine ends on (not only
    config.json's).
    ``no_stop_trim`` is always on: SGLang then keeps the matched stop string and the EOS text, and
    ``sglang_reply`` cuts a stop string the caller asked to exclude, as ``HFGenerator`` does.
    """
    out: dict[str, Any] = {}
    if "max_new_tokens" in params:
        out["max_new_tokens"] = int(params["max_new_tokens"])
    greedy = params.get("do_sample") is False
    if greedy:
        out["temperature"] = 0.0
    elif "temperature" in params:
        out["temperature"] = float(params["temperature"])
    if not greedy:
        if "top_p" in params:
            out["top_p"] = float(params["top_p"])
        if "top_k" in params:
            out["top_k"] = int(params["top_k"]) if int(params["top_k"]) > 0 else -1
    if "repetition_penalty" in params:
        out["repetition_penalty"] = float(params["repetition_penalty"])
    # keep <|im_end|> & co in SGLang's text, as the HF worker's decode does (SGLang skips them by default)
    out["skip_special_tokens"] = False
    out["no_stop_trim"] = True
    stop = list(params.get("stop") or [])
    if stop:
        out["stop"] = stop
    if eos_ids:
        out["stop_token_ids"] = sorted(int(i) for i in eos_ids)
    return out


def sglang_reply(
    result: dict[str, Any],
    decode: Callable[[list[int]], str],
    params: SamplingParams,
    eos_ids: Collection[int],
    *,
    return_logprobs: bool = False,
) -> GenerateReply:
    """One SGLang ``async_generate`` result for a request with ``params`` -> the generate reply the agent loop
    reads (pure).

    Same keys and meanings as the CPU worker's ``reply_of``; the turn's end is ``generation/turn_end.py``'s.
    SGLang's ``meta_info.finish_reason`` is ``{"type": "stop", "matched": "</search>"}`` for a stop string,
    ``{"type": "stop", "matched": <token id>}`` for EOS, ``{"type": "length", ...}`` at the budget and
    ``{"type": "abort", "message": ...}`` on failure. ``text`` exists only when the engine detokenizes
    (``rollout.detokenize``); otherwise ``decode(output_ids)``.
    """
    meta = result.get("meta_info") or {}
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else finish
    matched = finish.get("matched") if isinstance(finish, dict) else None
    if kind == "abort":
        message = finish.get("message") if isinstance(finish, dict) else None
        return {"error": f"SGLang aborted the request: {message or finish}"}
    if kind == "length":
        reason, stop = "length", None
    elif kind == "stop" and isinstance(matched, str):
        reason, stop = "stop", matched
    else:  # a matched token id (EOS or a stop token) ends the turn like EOS
        reason, stop = "eos", None
    text = result.get("text")
    end = turn_end(result["output_ids"], decode, eos_ids=eos_ids, stop=params.stop,
                   max_new_tokens=params.max_new_tokens, include_stop_str_in_output=params.include_stop_str_in_output,
                   engine_reason=reason, engine_stop=stop, text=text if isinstance(text, str) else None)
    reply: GenerateReply = {
        "output_ids": end.output_ids,
        "text": end.text,
        "finish_reason": end.finish_reason,
        "matched_stop": end.matched_stop,
        "logprobs": None,
        "num_generated": len(end.output_ids),
    }
    if return_logprobs:
        reply["logprobs"] = [float(item[0]) for item in meta["output_token_logprobs"]]
    return reply


def hf_eos_ids(model_path: str, tokenizer: Any = None) -> list[int]:
    """The EOS set the HF engine ends a turn on (generation_config + tokenizer), for ``stop_token_ids``."""
    tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_path)
    try:
        generation_config = GenerationConfig.from_pretrained(model_path)
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        generation_config = None
    return sorted(eos_token_ids(generation_config, tokenizer))
