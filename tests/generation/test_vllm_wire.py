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


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=32, do_sample=False, stop=["</search>", "</answer>"]),
        SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.95, top_k=40, repetition_penalty=1.05),
        SamplingParams(max_new_tokens=8, temperature=1.0, top_k=-1),
    ],
)
def test_request_keywords_make_vllms_sampling_params(params):
    made = VSamplingParams(**to_vllm_params(params, [151643, 151645], seed=3, return_logprobs=True))
    assert (made.max_tokens, made.seed, made.logprobs, made.include_stop_str_in_output) == (
        params.max_new_tokens,
        3,
        0,
        True,
    )
    assert set(made.stop_token_ids) == {151643, 151645}


def test_vllm_and_sglang_replies_give_the_same_result():
    """The same sampled ids, finished the same way, read from each engine's reply shape."""
    ids = [1, 2, 3, 4, 8, 5]
    params = SamplingParams(max_new_tokens=64, stop=["</search>"], include_stop_str_in_output=False)
    vllm_out = CompletionOutput(
        index=0,
        text="(vLLM's own text, not used)",
        token_ids=ids,
        cumulative_logprob=None,
        logprobs=[{t: Logprob(logprob=-0.1 * k, rank=1)} for k, t in enumerate(ids)],
        finish_reason="stop",
        stop_reason="</search>",
    )
    # one finished non-streaming reply of sglang 0.5.23's Engine.async_generate (tokenizer_manager.py)
    sglang_reply = {
        "text": "(SGLang's own text, not used)",
        "output_ids": ids,
        "meta_info": {
            "id": "8c1f",
            "finish_reason": {"type": "stop", "matched": "</search>"},
            "prompt_tokens": 11,
            "output_token_logprobs": [(-0.1 * k, t, None) for k, t in enumerate(ids)],
            "input_token_logprobs": [(None, 3, None)],
            "output_token_logprobs_length": len(ids),
        },
    }
    got_v = result_of_output(vllm_out, decode, params, [EOS], return_logprobs=True)
    got_s = result_of_sglang(sglang_reply, decode, params, [EOS], return_logprobs=True)
    assert got_v == got_s
    assert got_s.text == "<think> q</think><search> ans" and got_s.output_ids == ids


def spanned_output(ids, spans, finish_reason="length"):
    """vLLM 0.32's final ``CompletionOutput`` of ``ids`` whose tokens [start, end) were sampled by weights labelled
    ``version`` for each ``(start, end, version)`` in ``spans``."""
    from vllm.outputs import WeightVersionSpan

    return CompletionOutput(
        index=0,
        text="",
        token_ids=list(ids),
        cumulative_logprob=None,
        logprobs=[{t: Logprob(logprob=-0.1 * k, rank=1)} for k, t in enumerate(ids)],
        finish_reason=finish_reason,
        stop_reason=None,
        weight_versions=[WeightVersionSpan(version=v, start=a, end=b) for a, b, v in spans],
    )


def test_one_label_is_the_replys_version_and_vllms_default_is_none():
    """vLLM's own spans (``WeightVersionSpan``, on the final ``CompletionOutput``): one label is the whole reply's
    version; vLLM's unlabelled "default" (weights no update named), or no spans at all, is none."""
    from vllm.outputs import WeightVersionSpan

    from rlinf_ext.generation.vllm_wire import weight_version_of

    assert weight_version_of([WeightVersionSpan("3", 0, 5)], 5) == 3
    assert weight_version_of([WeightVersionSpan("default", 0, 5)], 5) is None
    assert weight_version_of(None, 5) is None and weight_version_of([], 0) is None
    assert weight_version_of([WeightVersionSpan("default", 0, 2), WeightVersionSpan("3", 2, 5)], 5) is None
    out = spanned_output([1, 2, 3], [(0, 3, "7")])
    assert result_of_output(out, decode, SamplingParams(max_new_tokens=3), [EOS]).weight_version == 7


def test_a_reply_that_spans_two_labels_gives_each_token_its_own_version():
    """A request vLLM preempted for KV space sits out a ``pause_generation(mode="wait")`` and resumes on the new
    weights: its spans name two labels, and each token keeps the version that sampled it."""
    from vllm.outputs import WeightVersionSpan

    from rlinf_ext.generation.vllm_wire import weight_version_of

    ids = [1, 2, 4, 8, 2, 8, 3]
    got = result_of_output(
        spanned_output(ids, [(0, 3, "4"), (3, 7, "5")]),
        decode,
        SamplingParams(max_new_tokens=7),
        [EOS],
        return_logprobs=True,
    )
    assert got.weight_version == [4, 4, 4, 5, 5, 5, 5] and got.output_ids == ids
    assert got.logprobs == pytest.approx([-0.1 * k for k in range(7)])  # each token's own, as sampled
    spans = [WeightVersionSpan(version="4", start=0, end=3), WeightVersionSpan(version="5", start=3, end=7)]
    assert weight_version_of(spans, 7) == [4, 4, 4, 5, 5, 5, 5]


def test_versions_are_cut_with_the_ids():
    """``turn_end`` keeps the ids up to the budget (vLLM checks stop strings after it); the versions follow, one
    label left is the reply's one version."""
    ids = [1, 2, 4, 8, 2, 8, 3]
    params = SamplingParams(max_new_tokens=6)
    cut = result_of_output(spanned_output(ids, [(0, 3, "4"), (3, 7, "5")]), decode, params, [EOS])
    assert cut.output_ids == ids[:6] and cut.weight_version == [4, 4, 4, 5, 5, 5]
    one = result_of_output(spanned_output(ids, [(0, 6, "4"), (6, 7, "5")]), decode, params, [EOS])
    assert one.output_ids == ids[:6] and one.weight_version == 4


def test_spans_that_do_not_tile_the_tokens_are_refused():
    from vllm.outputs import WeightVersionSpan

    from rlinf_ext.generation.vllm_wire import weight_version_of

    with pytest.raises(ValueError, match=r"cover tokens \[0, 3\) \+ \[4, 7\) of 7"):
        weight_version_of([WeightVersionSpan("4", 0, 3), WeightVersionSpan("5", 4, 7)], 7)
    with pytest.raises(ValueError, match=r"cover tokens \[0, 3\) \+ \[3, 6\) of 7"):
        weight_version_of([WeightVersionSpan("4", 0, 3), WeightVersionSpan("5", 3, 6)], 7)


# vLLM 0.26.0's CompletionOutput (its wheel's vllm/outputs.py): 0.32's fields up to lora_request; no weight_versions
# (0.26 has no weight-version labels at all: no WeightVersionSpan, no AsyncLLM.update_weight_version)
V026_COMPLETION_FIELDS = (
    "index",
    "text",
    "token_ids",
    "cumulative_logprob",
    "logprobs",
    "routed_experts",
    "finish_reason",
    "stop_reason",
    "lora_request",
)


def test_vllm_0_26s_output_without_spans_reads_as_unlabelled():
    import dataclasses

    def field_026(name):  # 0.32's own definition of a field 0.26 has too
        real = next(f for f in dataclasses.fields(CompletionOutput) if f.name == name)
        if real.default is dataclasses.MISSING:
            return name, real.type
        return name, real.type, dataclasses.field(default=real.default)

    v026 = dataclasses.make_dataclass("CompletionOutput", [field_026(name) for name in V026_COMPLETION_FIELDS])
    out = v026(index=0, text="", token_ids=[1, 2, 3], cumulative_logprob=None, logprobs=None, finish_reason="length")
    assert not hasattr(out, "weight_versions")
    got = result_of_output(out, decode, SamplingParams(max_new_tokens=3), [EOS])
    assert got.weight_version is None and got.output_ids == [1, 2, 3]
