"""GPU rollout: RLinf's SGLang worker with stop strings forwarded to the engine (NOT GPU-verified).

RLinf 0.3.0 builds SGLang sampling params from ``get_sampling_param_from_config``, which drops ``stop``;
per-request params are merged key by key, so the fix is to translate our request dict (contract §2
``SamplingParams``) into SGLang's names, config ``stop`` included. The reply gains ``text`` so the agent loop
sees the engine's cut (``detokenize: true`` is required for stop strings; the config rules check it).
vLLM: RLinf's ``VLLMWorker`` has no serving loop (``rollout_serverless``), so it cannot serve the agent
runner; ``to_vllm_params`` is the mapping a serving subclass would use. Imports of sglang/vLLM stay lazy.
"""

from __future__ import annotations

from typing import Any


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
    stop = list(params.get("stop") or default_stop or [])
    if stop:
        out["stop"] = stop
        # SGLang trims the matched stop string unless told not to; the agent loop keeps it (contract §2)
        out["no_stop_trim"] = bool(params.get("include_stop_str_in_output", True))
    return out


def to_vllm_params(params: dict[str, Any]) -> dict[str, Any]:
    """Our request ``sampling_params`` -> ``vllm.SamplingParams`` keyword arguments (pure)."""
    greedy = params.get("do_sample") is False
    out = {
        "max_tokens": int(params.get("max_new_tokens", 16)),
        "temperature": 0.0 if greedy else float(params.get("temperature", 1.0)),
        "top_p": 1.0 if greedy else float(params.get("top_p", 1.0)),
        "top_k": -1 if greedy or int(params.get("top_k", -1)) <= 0 else int(params["top_k"]),
        "repetition_penalty": float(params.get("repetition_penalty", 1.0)),
    }
    if params.get("stop"):
        out["stop"] = list(params["stop"])
        out["include_stop_str_in_output"] = bool(params.get("include_stop_str_in_output", True))
    return out


def make_sglang_stop_worker():
    """The SGLang worker subclass (imports sglang through RLinf; call only on GPU nodes)."""
    from rlinf.workers.rollout.sglang.sglang_worker import SGLangWorker

    class SGLangStopWorker(SGLangWorker):
        async def generate_and_send(self, output_channel, channel_key, prompt_ids, sampling_params=None):
            default_stop = list(getattr(self._cfg.algorithm.sampling_params, "stop", []) or [])
            params = to_sglang_params(dict(sampling_params or {}), default_stop)
            result = await self._engine.async_generate(
                input_ids=prompt_ids, sampling_params={**self._sampling_params, **params},
                return_logprob=self._return_logprobs,
            )
            meta = result["meta_info"]
            finish = meta["finish_reason"]
            reason = {"stop": "stop", "length": "length"}.get(finish.get("type"), "eos")
            if reason == "stop" and not isinstance(finish.get("matched"), str):
                reason = "eos"  # a matched token id (EOS), not a stop string
            reply = {"output_ids": result["output_ids"], "finish_reason": reason, "text": result.get("text"),
                     "matched_stop": finish.get("matched") if isinstance(finish.get("matched"), str) else None}
            if self._return_logprobs:
                reply["logprobs"] = [item[0] for item in meta["output_token_logprobs"]]
            await output_channel.put(reply, key=channel_key, async_op=True).async_wait()

    return SGLangStopWorker


def rollout_worker_class(cfg: Any):
    backend = cfg.rollout.rollout_backend
    if backend == "sglang":
        return make_sglang_stop_worker()
    if backend == "vllm":
        raise NotImplementedError(
            "rollout.rollout_backend=vllm: RLinf 0.3.0's VLLMWorker has no rollout_serverless loop, so it cannot "
            "serve the agent loop; use sglang on GPU (or hf on CPU)."
        )
    raise ValueError(f"rollout.rollout_backend={backend!r} is not a GPU backend (sglang|vllm).")
