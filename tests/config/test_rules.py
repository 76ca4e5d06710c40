"""Each validation rule: a bad config fails with an issue naming the key and a fix."""

from __future__ import annotations

import pytest

from rlinf_ext.config import check_config, load_config, validate

# The GPU example YAMLs (and these tests' SGLang wiring) name rollout_backend=sglang, which validate accepts only
# where the SGLang profile is installed (tests/config/test_sglang_profile.py): validate as there.
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")


def issues_for(name, overrides):
    result = check_config(name, overrides)
    return {i.key: i for i in result.issues}, result


def assert_issue(name, overrides, key, *words):
    by_key, result = issues_for(name, overrides)
    assert key in by_key, f"expected an issue on {key}, got {[str(i) for i in result.issues]}"
    issue = by_key[key]
    assert issue.fix.strip(), issue
    text = f"{issue.reason} {issue.fix}"
    for word in words:
        assert word in text, (word, str(issue))
    return issue


def test_good_configs_have_no_issue(reference_env):
    assert check_config("qwen2.5-3b-tool-1node").ok
    assert check_config("tiny-cpu").ok


def test_stop_strings_need_detokenize(reference_env):
    issue = assert_issue("qwen2.5-3b-tool-1node", ["rollout.detokenize=false"], "rollout.detokenize", "stop")
    assert "rollout.detokenize=true" in issue.fix
    # no stop strings: detokenize may be off
    assert check_config("qwen2.5-3b-tool-1node", ["rollout.detokenize=false", "algorithm.sampling_params.stop=[]"]).ok


def test_searchr1_agent_needs_recompute_logprobs(reference_env):
    issue = assert_issue("tiny-cpu", ["algorithm.recompute_logprobs=false"], "algorithm.recompute_logprobs")
    assert "algorithm.recompute_logprobs=true" in issue.fix


def test_vllm_logprobs_with_truncating_sampling_are_refused(reference_env):
    on = ["rollout.return_logprobs=true", "algorithm.sampling_params.top_p=0.9", "algorithm.sampling_params.top_k=20"]
    issue = assert_issue(
        "qwen2.5-3b-tool-1node",
        on,
        "rollout.return_logprobs",
        "algorithm.sampling_params.top_p",
        "algorithm.sampling_params.top_k",
        "rollout.return_logprobs=false",
    )
    assert "repetition_penalty" not in issue.reason
    # temperature alone is what the actor scales by; without kept log-probs any sampling is fine
    assert check_config(
        "qwen2.5-3b-tool-1node", ["rollout.return_logprobs=true", "algorithm.sampling_params.temperature=0.7"]
    ).ok
    assert check_config("qwen2.5-3b-tool-1node", on[1:]).ok


@pytest.mark.parametrize(
    "name, backend, why",
    [
        ("tiny-cpu", "hf", "raw logits"),
        ("qwen2.5-3b-tool-1node", "sglang", "before its top-k / top-p filters"),
        ("qwen2.5-3b-tool-1node", "vllm", "processed_logprobs"),
    ],
)
def test_engine_logprobs_with_truncating_sampling_are_refused_on_every_engine(reference_env, name, backend, why):
    """No engine returns, with top-p / top-k / a repetition penalty on, the log-prob of the distribution it sampled
    from computed as the actor computes it (logits / temperature): the behaviour weight would be wrong."""
    on = [
        f"rollout.rollout_backend={backend}",
        "rollout.return_logprobs=true",
        "algorithm.sampling_params.repetition_penalty=1.1",
    ]
    issue = assert_issue(
        name,
        on,
        "rollout.return_logprobs",
        "algorithm.sampling_params.repetition_penalty",
        f"rollout.rollout_backend={backend}",
        why,
        "rollout.return_logprobs=false",
    )
    assert "top_p" not in issue.reason
    assert check_config(name, on[:2] + ["algorithm.sampling_params.temperature=0.7"]).ok


def test_seq_length_must_exceed_prompt_length(reference_env):
    assert_issue(
        "qwen2.5-3b-tool-1node", ["runner.seq_length=4096"], "runner.seq_length", "4096", "data.max_prompt_length"
    )


def test_response_budget_fits_sequence(reference_env):
    assert_issue(
        "qwen2.5-3b-tool-1node", ["agentloop.response_length_total=4000"], "agentloop.response_length_total", "3000"
    )


def test_grpo_needs_group_larger_than_one(reference_env):
    assert_issue("qwen2.5-3b-tool-1node", ["algorithm.group_size=1"], "algorithm.group_size", "GRPO", "2 or more")


def test_evaluation_needs_group_of_one(reference_env):
    assert_issue("qwen2.5-3b-tool-1node-eval", ["algorithm.group_size=4"], "algorithm.group_size", "group_size=1")


def test_batch_divisible_by_minibatches(reference_env):
    # 5 x 8 = 40 trajectories cannot split into 3 minibatches
    assert_issue(
        "tiny-cpu", ["data.rollout_batch_size=5", "algorithm.n_minibatches=3"], "algorithm.n_minibatches", "40", "3"
    )


def test_batch_divisible_by_data_parallel_size(reference_env):
    # 6 x 4 = 24 -> 2 minibatches of 12, not divisible by DP=8 on the reference node
    issue = assert_issue(
        "qwen2.5-3b-tool-1node", ["data.rollout_batch_size=6"], "data.rollout_batch_size", "data-parallel size 8"
    )
    assert "data.rollout_batch_size=8" in issue.fix  # 8 x 4 / 2 = 16 = 2 x DP


def test_tp_divides_attention_heads(reference_env):
    # Qwen2.5-3B: 16 heads, 2 KV groups -> TP=4 divides the heads but not the KV groups
    issue = assert_issue(
        "qwen2.5-3b-tool-1node",
        ["actor.model.tensor_model_parallel_size=4"],
        "actor.model.tensor_model_parallel_size",
        "2 KV groups",
        "[1, 2]",
    )
    assert "TP=4" in issue.reason
    assert_issue(
        "qwen2.5-3b-tool-1node",
        ["rollout.tensor_parallel_size=3"],
        "rollout.tensor_parallel_size",
        "16 attention heads",
    )


def test_tp_read_from_hf_config_when_no_preset(reference_env, tmp_path):
    (tmp_path / "config.json").write_text('{"num_attention_heads": 6, "num_key_value_heads": 3}')
    overrides = [
        f"rollout.model.model_path={tmp_path}",
        "actor.model.num_attention_heads=null",
        "actor.model.tensor_model_parallel_size=2",
    ]
    issue = assert_issue("qwen2.5-3b-tool-1node", overrides, "actor.model.tensor_model_parallel_size", "3 KV groups")
    assert "config.json" in issue.reason


def test_tp_times_pp_divides_actor_gpus(reference_env):
    overrides = [
        "cluster.component_placement={actor: 0-5, 'rollout,reward': 6-7}",
        "data.rollout_batch_size=24",
        *NO_OFFLOAD,
    ]
    assert check_config("qwen2.5-3b-tool-1node", overrides).ok
    assert_issue(
        "qwen2.5-3b-tool-1node",
        overrides + ["actor.model.pipeline_model_parallel_size=4"],
        "actor.model.tensor_model_parallel_size",
        "does not divide the 6 ranks",
    )


@pytest.mark.parametrize(
    "spec, words",
    [
        ("0-8", ["rank 8", "8 GPUs"]),
        ("0-2,4-5", ["not contiguous"]),
        ("5-2", ["empty"]),
        ("zero", ["not a rank"]),
    ],
)
def test_placement_ranges(reference_env, spec, words):
    overrides = [f"cluster.component_placement={{'actor,rollout,reward': '{spec}'}}"]
    assert_issue("qwen2.5-3b-tool-1node", overrides, "cluster.component_placement.actor,rollout,reward", *words)


def test_placement_unknown_and_missing_component(reference_env):
    by_key, _ = issues_for("qwen2.5-3b-tool-1node", ["cluster.component_placement={'actor,rolout': all}"])
    assert "did you mean rollout" in by_key["cluster.component_placement.actor,rolout"].fix
    assert "reward" in by_key["cluster.component_placement"].reason


def test_two_nodes_make_room(reference_env):
    overrides = ["cluster.num_nodes=2", "cluster.component_placement={actor: 0-7, 'rollout,reward': 8-15}"]
    assert check_config("qwen2.5-3b-tool-1node", overrides + NO_OFFLOAD).ok


NO_OFFLOAD = ["actor.offload_weight=false", "actor.offload_optimizer=false", "actor.offload_grad=false"]


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["cluster.num_nodes=2", "cluster.component_placement={actor: 0-7, 'rollout,reward': 8-15}"], "disjoint GPUs"),
        (
            ["cluster.component_placement={actor: 0-5, 'rollout,reward': 6-7}", "data.rollout_batch_size=24"],
            "disjoint GPUs",
        ),
    ],
)
def test_offload_refused_where_nothing_is_offloaded(reference_env, overrides, words):
    """The reference config offloads for its collocated rollout; on disaggregated GPUs the same keys would do nothing."""
    issue = assert_issue("qwen2.5-3b-tool-1node", overrides, "actor.offload_weight", words)
    assert "actor.offload_weight=false" in issue.fix


def test_offload_refused_on_a_cpu_cluster():
    issue = assert_issue("tiny-cpu", ["actor.offload_weight=true"], "actor.offload_weight", "CPU cluster")
    assert "actor.offload_weight=false" in issue.fix


def test_recompute_logprobs_false_is_refused_for_every_agent():
    for name in ("tiny-cpu", "tiny-mm-cpu"):
        issue = assert_issue(
            name, ["algorithm.recompute_logprobs=false"], "algorithm.recompute_logprobs", "re-tokenises"
        )
        assert "recompute_logprobs=true" in issue.fix


def test_cpu_cluster_ranks_are_processes(reference_env):
    result = check_config(
        "tiny-cpu",
        ["cluster.component_placement={actor: 0-1, 'rollout,reward': 2}", "algorithm.training_batch_size_per_gpu=1"],
    )
    assert result.ok, [str(i) for i in result.issues]


def test_cpu_cluster_places_processes_on_nodes(reference_env):
    """RLinf's NODES:PROCESSES form on a CPU cluster: the nodes are checked against cluster.num_nodes."""
    two_nodes = [
        "cluster.num_nodes=2",
        "cluster.component_placement={actor: '0:0', 'rollout,agentloop': '1:0', reward: '0:0'}",
    ]
    result = check_config("tiny-cpu", two_nodes)
    assert result.ok, [str(i) for i in result.issues]
    assert_issue(
        "tiny-cpu", two_nodes[1:], "cluster.component_placement.rollout,agentloop", "node 1", "cluster.num_nodes is 1"
    )
    assert_issue(
        "tiny-cpu",
        ["cluster.num_nodes=2", "cluster.component_placement={'actor,rollout,reward': '0-1:0-2'}"],
        "cluster.component_placement.actor,rollout,reward",
        "do not split evenly over 2 node(s)",
    )


def test_gpu_backend_on_cpu_cluster(reference_env):
    assert_issue(
        "tiny-cpu", ["rollout.rollout_backend=sglang"], "rollout.rollout_backend", "rollout.rollout_backend=vllm"
    )


def test_cpu_engine_on_gpu_cluster(reference_env):
    assert_issue("qwen2.5-3b-tool-1node", ["rollout.rollout_backend=hf"], "rollout.rollout_backend", "CPU only")


def test_vllm_serves_both_agents(reference_env):
    for name in ("qwen2.5-3b-tool-1node", "qwen2.5-3b-tool-1node-eval", "tiny-cpu", "tiny-mm-cpu", "tiny-mm-cpu-eval"):
        result = check_config(name, ["rollout.rollout_backend=vllm"])
        assert not [i for i in result.issues if i.key == "rollout.rollout_backend"], result.issues


def test_collocated_gpus_need_both_offload_flags(reference_env):
    issue = assert_issue(
        "qwen2.5-3b-tool-1node",
        ["actor.offload_weight=false", "actor.offload_optimizer=false"],
        "actor.offload_weight",
        "actor.offload_weight and actor.offload_optimizer",
        "collocated",
        "actor.offload_weight=true actor.offload_optimizer=true",
    )
    assert "gpu_memory_utilization=0.75" in issue.reason
    assert_issue(
        "qwen2.5-3b-tool-1node",
        ["actor.offload_optimizer=false"],
        "actor.offload_optimizer",
        "actor.offload_optimizer=true",
    )
    disaggregated = [
        "cluster.component_placement={actor: 0-3, 'rollout,reward': 4-7}",
        "actor.offload_weight=false",
        "actor.offload_optimizer=false",
        "data.rollout_batch_size=256",
    ]
    assert "actor.offload_weight" not in issues_for("qwen2.5-3b-tool-1node", disaggregated)[0]
    assert check_config("tiny-cpu").ok  # CPU runs never offload


def test_the_actor_starts_from_the_rollout_model(reference_env):
    assert_issue(
        "qwen2.5-3b-tool-1node",
        ["actor.megatron.ckpt_convertor.hf_model_path=/other/model"],
        "actor.megatron.ckpt_convertor.hf_model_path",
        "rollout.model.model_path",
        "ignored",
    )


def test_search_topk_positive(reference_env):
    assert_issue("tiny-cpu", ["tools.search.topk=0"], "tools.search.topk", ">= 1")


def test_retrieval_source_needed(reference_env):
    assert_issue("tiny-cpu", ["retrieval.launch=false"], "tools.search.server_addr", "retrieval.launch=true")


def test_training_needs_data(reference_env):
    assert_issue("tiny-cpu", ["data.train_data_paths=[]"], "data.train_data_paths", "at least one")


def test_check_paths_only_on_request(reference_env, tmp_path):
    cfg = load_config("qwen2.5-3b-tool-1node")
    assert validate(cfg) == []
    keys = {i.key for i in validate(cfg, check_paths=True)}
    assert {"rollout.model.model_path", "data.train_data_paths[0]", "data.val_data_paths[0]"} <= keys


def test_parallel_sizes_positive(reference_env):
    assert_issue(
        "qwen2.5-3b-tool-1node", ["rollout.pipeline_parallel_size=0"], "rollout.pipeline_parallel_size", ">= 1"
    )


def test_prompts_split_over_actor_data_parallel_ranks():
    # two CPU actor processes train on whole GRPO groups: 3 prompts cannot be shared, 4 can
    overrides = ["cluster.component_placement={actor: 0-1, 'rollout,reward': 0}", "algorithm.n_minibatches=1"]
    issue = assert_issue(
        "tiny-cpu",
        overrides + ["data.rollout_batch_size=3"],
        "data.rollout_batch_size",
        "do not split over the actor's data-parallel size 2",
    )
    assert "data.rollout_batch_size=4" in issue.fix
    assert check_config("tiny-cpu", overrides + ["data.rollout_batch_size=4"]).ok


def test_values_supported_only_in_some_settings_are_refused_there(reference_env):
    fused = [
        f"actor.model.{k}"
        for k in (
            "apply_rope_fusion",
            "bias_dropout_fusion",
            "bias_activation_fusion",
            "persist_layer_norm",
            "gradient_accumulation_fusion",
        )
    ]
    by_key, result = issues_for("tiny-cpu", [f"{k}=true" for k in fused] + ["data.apply_chat_template=true"])
    for key in fused:
        assert "CUDA-only" in by_key[key].reason and f"{key}=false" in by_key[key].fix, result.issues
    assert "rlinf-ext preprocess" in by_key["data.apply_chat_template"].fix
    # the values rlinf_ext behaves as pass; evaluation may render its prompts with the chat template
    assert check_config("tiny-cpu").ok
    assert "data.apply_chat_template" not in issues_for("tiny-cpu-eval", ["data.apply_chat_template=true"])[0]
    # no stop strings: detokenize may be off
    assert check_config("qwen2.5-3b-tool-1node", ["rollout.detokenize=false", "algorithm.sampling_params.stop=[]"]).ok
