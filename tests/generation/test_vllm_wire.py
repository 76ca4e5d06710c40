"""vLLM's side of the request/reply translation (``generation/vllm_wire.py``) on vLLM's own types, no engine: the
request keywords build a real ``vllm.SamplingParams``, and a real ``CompletionOutput`` with real ``Logprob``
entries reads as the same ``GenerationResult`` as SGLang's reply of the same turn (``generation/sglang_wire.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams as VSamplingParams  # noqa: E402
from vllm.logprobs import Logprob  # noqa: E402
from vllm.outputs import CompletionOutput  # noqa: E402

from rlinf_ext.generation.sglang_wire import result_of_sglang  # noqa: E402
from rlinf_ext.generation.vllm_wire import result_of_output, to_vllm_params  # noqa: E402
from rlinf_ext.protocol.generation import SamplingParams  # noqa: E402

VOCAB = {1: "<think>", 2: " q", 3: "</think>", 4: "<search>", 5: "</search>", 7: "<|im_end|>", 8: " ans"}
EOS = 7


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=32, do_sample=False, stop=["</search>", "</answer>"]),
    SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.95, top_k=40, repetition_penalty=1.05),
    SamplingParams(max_new_tokens=8, temperature=1.0, top_k=-1),
])
def test_request_keywords_make_vllms_sampling_params(params):
    made = VSamplingParams(**to_vllm_params(params, [151643, 151645], seed=3, return_logprobs=True))
    assert (made.max_tokens, made.seed, made.logprobs, made.include_stop_str_in_output) == \
        (params.max_new_tokens, 3, 0, True)
    assert set(made.stop_token_ids) == {151643, 151645}


def test_vllm_and_sglang_replies_give_the_same_result():
    """The same sampled ids, finished the same way, read from each engine's reply shape."""
    ids = [1, 2, 3, 4, 8, 5]
    params = SamplingParams(max_new_tokens=64, stop=["</search>"], include_stop_str_in_output=False)
    vllm_out = CompletionOutput(index=0, text="(vLLM's own text, not used)", token_ids=ids, cumulative_logprob=None,
                                logprobs=[{t: Logprob(logprob=-0.1 * k, rank=1)} for k, t in enumerate(ids)],
                                finish_reason="stop", stop_reason="</search>")
    # one finished non-streaming reply of sglang 0.5.23's Engine.async_generate (tokenizer_manager.py)
    sglang_reply = {"text": "(SGLang's own text, not used)", "output_ids": ids, "meta_info": {
        "id": "8c1f", "finish_reason": {"type": "stop", "matched": "</search>"}, "prompt_tokens": 11,
        "output_token_logprobs": [(-0.1 * k, t, None) for k, t in enumerate(ids)],
        "input_token_logprobs": [(None, 3, None)], "output_token_logprobs_length": len(ids)}}
    got_v = result_of_output(vllm_out, decode, params, [EOS], return_logprobs=True)
    got_s = result_of_sglang(sglang_reply, decode, params, [EOS], return_logprobs=True)
    assert got_v == got_s
    assert got_s.text == "<think> q</think><search> ans" and got_s.output_ids == ids


def test_vllms_weight_version_spans_make_the_replys_one_version():
    """vLLM's own spans (``WeightVersionSpan``, on the final ``CompletionOutput``): one label is the reply's version,
    vLLM's unlabelled "default" is none, two labels (an update landed mid-generation) are refused."""
    from vllm.outputs import WeightVersionSpan

    from rlinf_ext.generation.vllm_wire import weight_version_of

    assert weight_version_of([WeightVersionSpan("3", 0, 5)]) == 3
    assert weight_version_of([WeightVersionSpan("default", 0, 5)]) is None
    assert weight_version_of(None) is None and weight_version_of([]) is None
    with pytest.raises(RuntimeError, match=r"weight versions \['3', '4'\].*mode='wait'"):
        weight_version_of([WeightVersionSpan("3", 0, 2), WeightVersionSpan("4", 2, 5)])
    out = CompletionOutput(index=0, text="", token_ids=[1, 2, 3], cumulative_logprob=None, logprobs=None,
                           finish_reason="length", stop_reason=None, weight_versions=[WeightVersionSpan("7", 0, 3)])
    assert result_of_output(out, decode, SamplingParams(max_new_tokens=3), [EOS]).weight_version == 7
