"""The GPU rollout subclass's pure parts: parameter mapping, reply construction, sync check (engines need a GPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlinf_ext.agent.types import GenerationResult
from rlinf_ext.engines.gpu_rollout import (
    probe_logprob_gap,
    sglang_reply,
    to_sglang_params,
    to_vllm_params,
    weight_buckets,
)
from rlinf_ext.engines.rollout_worker import reply_of
from rlinf_ext.engines.weight_sync import WeightSyncError

VOCAB = {1: "<think>", 2: " q", 3: "</think>", 4: "<search>", 5: "</search>", 6: "\n", 7: "<|im_end|>", 8: " ans"}
EOS = 7


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


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
    greedy = to_sglang_params({"do_sample": False, "temperature": 0.7}, default_stop=["</answer>"])
    assert greedy == {"temperature": 0.0, "skip_special_tokens": False, "stop": ["</answer>"], "no_stop_trim": True}


def test_vllm_params_forward_stop():
    p = to_vllm_params({"max_new_tokens": 8, "do_sample": True, "temperature": 1.0, "top_k": 5, "stop": ["</search>"]})
    assert p["stop"] == ["</search>"] and p["include_stop_str_in_output"] is True
    assert p["max_tokens"] == 8 and p["top_k"] == 5


def test_reply_for_a_stop_string_uses_sglang_text_when_detokenizing():
    ids = [1, 2, 3, 6, 4, 2, 5]
    reply = sglang_reply(sglang_result(ids, {"type": "stop", "matched": "</search>"}, text=decode(ids)), must_not_decode)
    assert reply == {"output_ids": ids, "text": "<think> q</think>\n<search> q</search>", "finish_reason": "stop",
                     "matched_stop": "</search>", "logprobs": None, "num_generated": 7}


def test_reply_decodes_output_ids_when_sglang_has_no_text():
    ids = [4, 2, 5]
    result = sglang_result(ids, {"type": "stop", "matched": "</search>"})
    assert sglang_reply(result, decode)["text"] == "<search> q</search>"
    trimmed = sglang_reply(result, decode, include_stop_str_in_output=False)
    assert trimmed["text"] == "<search> q" and trimmed["output_ids"] == ids  # ids keep every sampled token


def test_reply_for_eos_and_length():
    eos = sglang_reply(sglang_result([8, EOS], {"type": "stop", "matched": EOS}), decode)
    assert eos["finish_reason"] == "eos" and eos["matched_stop"] is None
    assert eos["output_ids"] == [8, EOS] and eos["text"] == " ans<|im_end|>"  # EOS kept, like the HF worker
    length = sglang_reply(sglang_result([1, 2, 2], {"type": "length", "length": 3}), decode)
    assert length["finish_reason"] == "length" and length["matched_stop"] is None and length["text"] == "<think> q q"


def test_reply_logprobs_and_abort():
    reply = sglang_reply(sglang_result([8, EOS], {"type": "stop", "matched": EOS}, logprobs=[-0.5, -0.25]), decode,
                         return_logprobs=True)
    assert reply["logprobs"] == [-0.5, -0.25]
    aborted = sglang_reply(sglang_result([], {"type": "abort", "message": "input is longer than the context"}), decode)
    assert set(aborted) == {"error"} and "input is longer than the context" in aborted["error"]


def test_reply_has_the_cpu_workers_fields():
    """Same keys as ``rollout_worker.reply_of``, and the agent loop can rebuild its GenerationResult from it."""
    ids = [4, 2, 5]
    reply = sglang_reply(sglang_result(ids, {"type": "stop", "matched": "</search>"}), decode)
    cpu = reply_of(GenerationResult(output_ids=ids, text=decode(ids), finish_reason="stop", matched_stop="</search>",
                                    logprobs=None))
    assert set(reply) == set(cpu)
    assert reply == cpu
    fields = {f.name for f in dataclasses.fields(GenerationResult)}
    assert GenerationResult(**{k: v for k, v in reply.items() if k in fields}).finish_reason == "stop"


def test_probe_logprob_gap_compares_engine_and_actor():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (1, 6))
    logits = torch.randn(1, 6, 50) * 3
    exact = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
    entries = [(None, int(ids[0, 0]), None)] + [(lp, int(t), None) for lp, t in zip(exact, ids[0, 1:])]
    assert probe_logprob_gap(ids, logits, entries) < 1e-5
    shifted = [entries[0]] + [(lp + 1.0, t, x) for lp, t, x in entries[1:]]
    assert probe_logprob_gap(ids, logits, shifted) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(WeightSyncError, match="probe log-probs"):
        probe_logprob_gap(ids, logits, entries[:-1])


def test_weight_buckets_bound_the_bytes_per_transfer():
    state = {"a": torch.zeros(10), "b": torch.zeros(10), "c": torch.zeros(30), "d": torch.zeros(5)}  # fp32: 40/40/120/20 B
    buckets = [[name for name, _ in b] for b in weight_buckets(state, max_bytes=80)]
    assert buckets == [["a", "b"], ["c"], ["d"]]
    assert sum(len(b) for b in weight_buckets(state)) == 4


def test_unusable_sglang_import_names_the_fix():
    from rlinf_ext.engines.gpu_rollout import GPU_INSTALL_FIX, SGLangUnavailable, import_rlinf_sglang

    with pytest.raises(SGLangUnavailable) as err:
        import_rlinf_sglang("rlinf_ext_no_such_module.sglang", "Engine", "set rollout.rollout_backend=hf")
    assert GPU_INSTALL_FIX in str(err.value) and "rollout.rollout_backend=hf" in str(err.value)
    assert isinstance(err.value.__cause__, ImportError)
