"""The request/reply translation shared by vLLM and SGLang (``generation/turn_end.py:engine_sampling`` /
``engine_finish``) and SGLang 0.5.23's own (``generation/sglang_wire.py``), on hand-built replies in 0.5.23's
shapes (``{"text", "output_ids", "meta_info": {"finish_reason", "prompt_tokens", "output_token_logprobs", ...}}``).
Pure: no engine, no model."""

from __future__ import annotations

import pytest

from rlinf_ext.generation.sglang_engine import SGLANG_INSTALL_FIX, SGLangUnavailable, import_sglang
from rlinf_ext.generation.sglang_wire import result_of_sglang, to_sglang_params
from rlinf_ext.generation.turn_end import EngineSampling, engine_finish, engine_sampling
from rlinf_ext.generation.vllm_wire import engine_reason, to_vllm_params
from rlinf_ext.protocol.generation import GenerationResult, SamplingParams, reply_of
from tests.support.sglang_fakes import check_generate

VOCAB = {1: "<think>", 2: " q", 3: "</think>", 4: "<search>", 5: "</search>", 6: "\n", 7: "<|im_end|>", 8: " ans"}
EOS = 7
STOP = SamplingParams(max_new_tokens=64, stop=["</search>"])


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def sglang_result(ids, finish, text="(SGLang's own text, not used)", logprobs=None):
    """One finished non-streaming reply of sglang 0.5.23's ``Engine.async_generate`` (tokenizer_manager.py)."""
    meta = {
        "id": "8c1f",
        "finish_reason": finish,
        "prompt_tokens": 11,
        "weight_version": "default",
        "num_retractions": 0,
    }
    if logprobs is not None:
        meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(logprobs, ids)]
        meta["input_token_logprobs"] = [(None, 3, None)]
        meta["output_token_logprobs_length"] = len(ids)
    return {"text": text, "output_ids": list(ids), "meta_info": meta}


# ------------------------------------------------------------------------------------------------ shared
def test_engine_sampling_greedy_sampled_and_off_values():
    greedy = engine_sampling(
        SamplingParams(max_new_tokens=9, do_sample=False, temperature=0.7, top_p=0.5, top_k=5, stop=["</a>"]), [7, 3, 7]
    )
    assert greedy == EngineSampling(
        max_new_tokens=9,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        stop=["</a>"],
        stop_token_ids=[3, 7],
    )
    assert engine_sampling(SamplingParams(temperature=0.0), []).temperature == 0.0  # temperature 0 = greedy too
    sampled = engine_sampling(SamplingParams(temperature=0.7, top_p=0.9, top_k=20, repetition_penalty=1.1), [2])
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.repetition_penalty) == (0.7, 0.9, 20, 1.1)
    assert (
        engine_sampling(SamplingParams(top_k=-1), []).top_k == 0
        and engine_sampling(SamplingParams(top_k=0), []).top_k == 0
    )


def test_engine_finish_reads_both_engines_the_same():
    assert engine_finish("stop", "</search>", "X") == ("stop", "</search>")
    assert engine_finish("stop", 7, "X") == ("eos", None)  # SGLang: the matched EOS id
    assert engine_finish("stop", None, "X") == ("eos", None)  # vLLM: EOS has no stop_reason
    assert engine_finish("length", None, "X") == ("length", None)
    with pytest.raises(RuntimeError, match="SGLang ended the request with finish reason 'abort'"):
        engine_finish("abort", None, "SGLang")
    assert engine_reason("stop", "</answer>") == ("stop", "</answer>") and engine_reason("stop", 151645) == (
        "eos",
        None,
    )


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=32, do_sample=False, stop=["</search>", "</answer>"]),
        SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.95, top_k=40, repetition_penalty=1.05),
        SamplingParams(max_new_tokens=8, temperature=1.0, top_k=-1),
    ],
)
def test_vllm_and_sglang_requests_mean_the_same(params):
    v, s = to_vllm_params(params, [151643, 151645]), to_sglang_params(params, [151645, 151643])
    assert (v["max_tokens"], v["stop_token_ids"], v["stop"]) == (
        s["max_new_tokens"],
        s["stop_token_ids"],
        s.get("stop", []),
    )
    assert (v["temperature"], v["top_p"], v["repetition_penalty"]) == (
        s["temperature"],
        s["top_p"],
        s["repetition_penalty"],
    )
    assert v["top_k"] == (s["top_k"] if s["top_k"] > 0 else 0)  # off: vLLM 0, SGLang -1
    # both keep the stop string in the ids and the text, and special tokens in the text
    assert v["include_stop_str_in_output"] and s["no_stop_trim"]
    assert v["skip_special_tokens"] is False and s["skip_special_tokens"] is False


# ------------------------------------------------------------------------------------------------ SGLang's own
def test_sglang_params_in_sglangs_names(sglang_source):
    greedy = to_sglang_params(SamplingParams(max_new_tokens=12, do_sample=False, stop=["</search>"]), [EOS, 2])
    assert greedy == {
        "max_new_tokens": 12,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "stop_token_ids": [2, EOS],
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "stop": ["</search>"],
    }
    assert "stop" not in to_sglang_params(SamplingParams(), [EOS])  # no stop strings: no detokenizing check
    # the TokenizerManager builds sglang's SamplingParams(**sampling_params) from them, with the request itself
    for params in (greedy, to_sglang_params(SamplingParams(temperature=0.7, top_k=20), [EOS])):
        sent = check_generate(sglang_source, None, input_ids=[1, 2], sampling_params=params, return_logprob=True)
        assert sent["sampling_params"] is params


def test_stop_string_reply():
    got = result_of_sglang(
        sglang_result([1, 2, 3, 4, 8, 5], {"type": "stop", "matched": "</search>"}), decode, STOP, [EOS]
    )
    assert got == GenerationResult([1, 2, 3, 4, 8, 5], "<think> q</think><search> ans</search>", "stop", "</search>")


def test_eos_and_length_replies():
    eos = result_of_sglang(sglang_result([8, 7], {"type": "stop", "matched": 7}), decode, STOP, [EOS])
    assert (eos.finish_reason, eos.matched_stop, eos.output_ids, eos.text) == ("eos", None, [8, 7], " ans<|im_end|>")
    length = result_of_sglang(
        sglang_result([2, 2, 2], {"type": "length", "length": 3}), decode, STOP.with_updates(max_new_tokens=3), [EOS]
    )
    assert (length.finish_reason, length.output_ids) == ("length", [2, 2, 2])


def test_a_length_reply_whose_last_token_ends_the_turn_is_eos():
    """0.5.23 checks EOS before the budget, so this only comes from an engine that did not: the shared rule holds."""
    got = result_of_sglang(
        sglang_result([8, 7], {"type": "length", "length": 2}), decode, STOP.with_updates(max_new_tokens=2), [EOS]
    )
    assert got.finish_reason == "eos"


def test_logprobs_must_belong_to_the_output_ids():
    got = result_of_sglang(
        sglang_result([4, 8, 5], {"type": "stop", "matched": "</search>"}, logprobs=[-1, -2, -3]),
        decode,
        STOP,
        [EOS],
        return_logprobs=True,
    )
    assert got.logprobs == [-1.0, -2.0, -3.0]
    bad = sglang_result([4, 8, 5], {"type": "stop", "matched": "</search>"}, logprobs=[-1, -2, -3])
    bad["meta_info"]["output_token_logprobs"][1] = (-2.0, 6, None)
    with pytest.raises(RuntimeError, match="do not match its 3 output ids"):
        result_of_sglang(bad, decode, STOP, [EOS], return_logprobs=True)
    with pytest.raises(RuntimeError, match="none returned"):
        result_of_sglang(sglang_result([4], {"type": "length"}), decode, STOP, [EOS], return_logprobs=True)


def test_abort_and_missing_finish_raise():
    with pytest.raises(RuntimeError, match="SGLang aborted the request: prompt too long"):
        result_of_sglang(
            sglang_result([], {"type": "abort", "message": "prompt too long", "status_code": 400}), decode, STOP, [EOS]
        )
    with pytest.raises(RuntimeError, match="no finish reason"):
        result_of_sglang({"output_ids": [1], "meta_info": {"finish_reason": None}}, decode, STOP, [EOS])


def test_reply_has_the_cpu_workers_fields():
    reply = reply_of(
        result_of_sglang(sglang_result([4, 5], {"type": "stop", "matched": "</search>"}), decode, STOP, [EOS])
    )
    assert set(reply) == {
        "output_ids",
        "text",
        "finish_reason",
        "matched_stop",
        "logprobs",
        "num_generated",
        "weight_version",
    }
    assert reply["num_generated"] == 2


def test_unusable_sglang_import_names_the_fix():
    with pytest.raises(SGLangUnavailable) as err:
        import_sglang("rlinf_ext_no_such_module.sglang", "Engine", "set rollout.rollout_backend=hf")
    assert SGLANG_INSTALL_FIX in str(err.value) and "rollout.rollout_backend=hf" in str(err.value)
    assert "bash scripts/install.sh --sglang" in SGLANG_INSTALL_FIX
    assert isinstance(err.value.__cause__, ImportError)
