"""The GPU rollout subclasses' parameter mapping (pure; the engines themselves need a GPU)."""

from rlinf_ext.engines.gpu_rollout import to_sglang_params, to_vllm_params


def test_sglang_params_forward_stop():
    p = to_sglang_params({"max_new_tokens": 32, "do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": -1,
                          "stop": ["</search>", "</answer>"], "include_stop_str_in_output": True})
    assert p == {"max_new_tokens": 32, "temperature": 0.7, "top_p": 0.9, "top_k": -1,
                 "stop": ["</search>", "</answer>"], "no_stop_trim": True}
    greedy = to_sglang_params({"do_sample": False, "temperature": 0.7}, default_stop=["</answer>"])
    assert greedy == {"temperature": 0.0, "stop": ["</answer>"], "no_stop_trim": True}


def test_vllm_params_forward_stop():
    p = to_vllm_params({"max_new_tokens": 8, "do_sample": True, "temperature": 1.0, "top_k": 5, "stop": ["</search>"]})
    assert p["stop"] == ["</search>"] and p["include_stop_str_in_output"] is True
    assert p["max_tokens"] == 8 and p["top_k"] == 5
