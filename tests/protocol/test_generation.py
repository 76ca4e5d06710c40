"""The generation contract's channel form: requests merge into the config's sampling params key by key, and a
reply dict carries a GenerationResult across a channel unchanged."""

from __future__ import annotations

import pytest

from rlinf_ext.protocol.generation import (
    STOP_SERVING,
    WEIGHT_VERSION,
    GenerationResult,
    SamplingParams,
    reply_of,
    result_of,
    sampling_params_from_request,
)


def test_request_overrides_defaults_key_by_key():
    defaults = SamplingParams(max_new_tokens=500, temperature=1.0, stop=["</search>"])
    merged = sampling_params_from_request(defaults, {"max_new_tokens": 7, "stop": ["</answer>"]})
    assert (merged.max_new_tokens, merged.temperature, merged.stop) == (7, 1.0, ["</answer>"])
    assert defaults.stop == ["</search>"] and defaults.max_new_tokens == 500  # the defaults are not touched
    assert sampling_params_from_request(defaults, None) == defaults.with_updates(stop=[])
    with pytest.raises(ValueError, match=r"unknown sampling params.*\['temprature'\]"):
        sampling_params_from_request(defaults, {"temprature": 0.5})


def test_reply_round_trip_keeps_every_field():
    result = GenerationResult(
        output_ids=[4, 2, 5],
        text="<search> q</search>",
        finish_reason="stop",
        matched_stop="</search>",
        logprobs=[-0.1, -0.2, -0.3],
        num_generated=3,
        weight_version=4,
    )
    assert result_of(reply_of(result)) == result
    assert reply_of(result)[WEIGHT_VERSION] == 4 == result_of(reply_of(result)).weight_version
    no_logprobs = GenerationResult(output_ids=[8, 7], text=" ans<|im_end|>", finish_reason="eos")
    reply = reply_of(no_logprobs)
    assert reply["num_generated"] == 2 and reply["logprobs"] is None
    assert result_of(reply).generated_tokens == 2
    assert reply[WEIGHT_VERSION] is None and result_of(reply).weight_version is None  # an engine without versions


def test_a_reply_sampled_by_two_versions_carries_one_per_token():
    """A vLLM request a sync passed while it was preempted: one version per output id, across a channel too."""
    from rlinf_ext.protocol.generation import token_versions

    result = GenerationResult(
        output_ids=[4, 2, 5, 6], text="", finish_reason="length", num_generated=4, weight_version=[4, 4, 5, 5]
    )
    assert result_of(reply_of(result)) == result and reply_of(result)[WEIGHT_VERSION] == [4, 4, 5, 5]
    assert token_versions([4, 4, 5, 5], 4) == [4, 4, 5, 5]
    assert token_versions(3, 2) == [3, 3] and token_versions(3, 0) == [] and token_versions(None, 2) is None
    with pytest.raises(ValueError, match="3 weight versions for 4 sampled ids"):
        token_versions([4, 4, 5], 4)


def test_error_reply_raises_and_unknown_finish_reason_ends_the_turn():
    with pytest.raises(RuntimeError, match="rollout engine failed to generate: CUDA out of memory"):
        result_of({"error": "CUDA out of memory"})
    odd = result_of({"output_ids": [1], "text": "x", "finish_reason": "abort"})
    assert odd.finish_reason == "eos" and odd.matched_stop is None and odd.text == "x"


def test_stop_serving_is_not_a_plausible_channel_key():
    # channel keys are uuid4 hex strings; the stop marker can never collide with one
    assert STOP_SERVING.startswith("__") and len(STOP_SERVING) != 32


def test_the_stop_list_is_the_requests_alone():
    """Configured stop strings never reach an engine: a request naming none has none."""
    defaults = SamplingParams(temperature=0.6, stop=["</search>", "</answer>"])
    assert sampling_params_from_request(defaults, {"stop": ["</x>"]}).stop == ["</x>"]
    assert sampling_params_from_request(defaults, {"temperature": 1.0}).stop == []
    assert sampling_params_from_request(defaults, {}).stop == []
