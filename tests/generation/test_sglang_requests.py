"""SGLang request/reply translation (pure; the engine itself needs a GPU): what ``to_sglang_params`` sends and
what ``sglang_reply`` makes of SGLang 0.4.6's ``async_generate`` results."""

from __future__ import annotations

import dataclasses

import pytest

from rlinf_ext.generation.sglang_engine import GPU_INSTALL_FIX, SGLangUnavailable, import_rlinf_sglang
from rlinf_ext.generation.sglang_wire import sglang_reply, to_sglang_params
from rlinf_ext.protocol.generation import GenerationResult, SamplingParams, reply_of

VOCAB = {1: "<think>", 2: " q", 3: "</think>", 4: "<search>", 5: "</search>", 6: "\n", 7: "<|im_end|>", 8: " ans"}
EOS = 7


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def reply_for(result, decode_fn, budget=64, include_stop_str_in_output=True, return_logprobs=False):
    """``sglang_reply`` for a request stopping at ``</search>`` with ``budget`` new tokens."""
    params = SamplingParams(max_new_tokens=budget, stop=["</search>"], include_stop_str_in_output=include_stop_str_in_output)
    return sglang_reply(result, decode_fn, params, [EOS], return_logprobs=return_logprobs)


def must_not_decode(ids: list[int]) -> str:
    raise AssertionError("SGLang's own text must be used when present")


def sglang_result(ids, finish, text=None, logprobs=None):
    """What SGLang 0.4.6's async_generate returns for one prompt (text only when detokenize is on)."""
    meta = {"finish_reason": finish, "prompt_tokens": 11, "completion_tokens": len(ids)}
    if logprobs is not None:
        meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(logprobs, ids)]
    out = {"output_ids": list(ids), "meta_info": meta}
    if text is not None:
        out["text"] = text
    return out


def test_sglang_params_forward_stop():
    p = to_sglang_params({"max_new_tokens": 32, "do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": -1,
                          "stop": ["</search>", "</answer>"], "include_stop_str_in_output": True})
    assert p == {"max_new_tokens": 32, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "skip_special_tokens": False,
                 "stop": ["</search>", "</answer>"], "no_stop_trim": True}
    greedy = to_sglang_params({"do_sample": False, "temperature": 0.7, "stop": ["</answer>"]}, eos_ids=(9, 3))
    assert greedy == {"temperature": 0.0, "skip_special_tokens": False, "stop": ["</answer>"], "no_stop_trim": True,
                      "stop_token_ids": [3, 9]}


def test_sglang_params_name_only_what_the_request_names():
    """A request without temperature must not send one: the config's temperature (merged in by the caller, or
    SGLang's) stays. SGLang always keeps the stop string (no_stop_trim); an excluded one is cut from the reply."""
    p = to_sglang_params({"max_new_tokens": 8, "include_stop_str_in_output": False})
    assert p == {"max_new_tokens": 8, "skip_special_tokens": False, "no_stop_trim": True}


def test_reply_for_a_stop_string_uses_sglang_text_when_detokenizing():
    ids = [1, 2, 3, 6, 4, 2, 5]
    reply = reply_for(sglang_result(ids, {"type": "stop", "matched": "</search>"}, text=decode(ids)), must_not_decode)
    assert reply == {"output_ids": ids, "text": "<think> q</think>\n<search> q</search>", "finish_reason": "stop",
                     "matched_stop": "</search>", "logprobs": None, "num_generated": 7}


def test_reply_decodes_output_ids_when_sglang_has_no_text():
    ids = [4, 2, 5]
    result = sglang_result(ids, {"type": "stop", "matched": "</search>"})
    assert reply_for(result, decode)["text"] == "<search> q</search>"
    trimmed = reply_for(result, decode, include_stop_str_in_output=False)
    assert trimmed["text"] == "<search> q" and trimmed["output_ids"] == ids  # ids keep every sampled token


def test_an_excluded_stop_string_is_cut_from_sglang_text_too():
    """no_stop_trim is always on, so SGLang's own text ends with the stop string; the reply cuts it."""
    ids = [4, 2, 5]
    result = sglang_result(ids, {"type": "stop", "matched": "</search>"}, text=decode(ids))
    reply = reply_for(result, must_not_decode, include_stop_str_in_output=False)
    assert reply["text"] == "<search> q" and reply["output_ids"] == ids


def test_reply_for_eos_and_length():
    eos = reply_for(sglang_result([8, EOS], {"type": "stop", "matched": EOS}), decode)
    assert eos["finish_reason"] == "eos" and eos["matched_stop"] is None
    assert eos["output_ids"] == [8, EOS] and eos["text"] == " ans<|im_end|>"  # EOS kept, like the HF worker
    length = reply_for(sglang_result([1, 2, 2], {"type": "length", "length": 3}), decode, budget=3)
    assert length["finish_reason"] == "length" and length["matched_stop"] is None and length["text"] == "<think> q q"


def test_a_length_reply_ending_on_eos_or_a_stop_string_is_eos_or_stop():
    """SGLang checks the budget first: its last allowed token may be EOS or complete the stop string, and SGLang
    still says "length". The reply says what HF would: eos / stop (the ids and text stay as sampled)."""
    eos = reply_for(sglang_result([8, EOS], {"type": "length", "length": 2}), decode, budget=2)
    assert (eos["finish_reason"], eos["matched_stop"], eos["output_ids"]) == ("eos", None, [8, EOS])
    stop = reply_for(sglang_result([4, 2, 5], {"type": "length", "length": 3}, text="<search> q</search>"),
                     decode, budget=3, include_stop_str_in_output=False)
    assert (stop["finish_reason"], stop["matched_stop"], stop["output_ids"]) == ("stop", "</search>", [4, 2, 5])
    assert stop["text"] == "<search> q"


def test_reply_logprobs_and_abort():
    reply = reply_for(sglang_result([8, EOS], {"type": "stop", "matched": EOS}, logprobs=[-0.5, -0.25]), decode,
                      return_logprobs=True)
    assert reply["logprobs"] == [-0.5, -0.25]
    aborted = reply_for(sglang_result([], {"type": "abort", "message": "input is longer than the context"}), decode)
    assert set(aborted) == {"error"} and "input is longer than the context" in aborted["error"]


def test_reply_has_the_cpu_workers_fields():
    """Same keys as ``protocol.generation.reply_of`` (the CPU worker's reply), and the agent loop can rebuild its GenerationResult from it."""
    ids = [4, 2, 5]
    reply = reply_for(sglang_result(ids, {"type": "stop", "matched": "</search>"}), decode)
    cpu = reply_of(GenerationResult(output_ids=ids, text=decode(ids), finish_reason="stop", matched_stop="</search>",
                                    logprobs=None))
    assert set(reply) == set(cpu)
    assert reply == cpu
    fields = {f.name for f in dataclasses.fields(GenerationResult)}
    assert GenerationResult(**{k: v for k, v in reply.items() if k in fields}).finish_reason == "stop"


def test_unusable_sglang_import_names_the_fix():
    with pytest.raises(SGLangUnavailable) as err:
        import_rlinf_sglang("rlinf_ext_no_such_module.sglang", "Engine", "set rollout.rollout_backend=hf")
    assert GPU_INSTALL_FIX in str(err.value) and "rollout.rollout_backend=hf" in str(err.value)
    assert isinstance(err.value.__cause__, ImportError)
