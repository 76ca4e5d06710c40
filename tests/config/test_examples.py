"""Every experiment YAML in the repo validates; the reference values are the ones of docs/searchr1-facts.md §7."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf_ext.config import check_config, load_config, to_dictconfig
from rlinf_ext.config.compose import REPO_ROOT

# The GPU example YAMLs (and these tests' SGLang wiring) name rollout_backend=sglang, which validate accepts only
# where the SGLang profile is installed (tests/config/test_sglang_profile.py): validate as there.
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")

EXAMPLE_YAMLS = sorted((REPO_ROOT / "examples").rglob("*.yaml"))
EXPERIMENT_YAMLS = [p for p in EXAMPLE_YAMLS if p.parent.name == "config"]


# the model the reference recipe passes on the command line (examples/searchr1/reference_recipe.sh)
COMMAND_LINE = {
    "tiny-recipe.yaml": ["rollout.model.model_path=/models/tiny"],
    "tiny-recipe-eval.yaml": ["rollout.model.model_path=/models/tiny"],
}


def test_every_example_yaml_validates(reference_env):
    checked = 0
    for path in EXPERIMENT_YAMLS:
        result = check_config(path, COMMAND_LINE.get(path.name, []))
        assert result.ok, f"{path}:\n" + "\n".join(str(i) for i in result.issues)
        checked += 1
    assert checked == 11, [p.name for p in EXPERIMENT_YAMLS]
    assert {p.name for p in EXPERIMENT_YAMLS} == {
        "tiny-recipe.yaml",
        "tiny-recipe-eval.yaml",
        "qwen2.5-3b-tool-1node.yaml",
        "qwen2.5-3b-tool-1node-eval.yaml",
        "tiny-cpu.yaml",
        "tiny-cpu-eval.yaml",
        "tiny-mm-cpu-eval.yaml",
        "qwen2.5-vl-7b-eval.yaml",
        "tiny-mm-cpu.yaml",
        "qwen2.5-vl-7b-1node.yaml",
        "qwen2.5-vl-7b-1node-collocated.yaml",
    }


def test_names_resolve_from_any_cwd(reference_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config("qwen2.5-3b-tool-1node")
    assert cfg.runner.seq_length == 7096


def test_reference_values(reference_env):
    cfg = load_config("qwen2.5-3b-tool-1node")
    assert cfg.cluster.component_placement == {"actor,rollout,reward": "all"}
    assert cfg.cluster.num_nodes == 1 and cfg.cluster.num_gpus_per_node == 8
    assert cfg.rollout.rollout_backend == "vllm" and cfg.rollout.detokenize is True
    assert {"</search>", "</answer>", "<|im_end|>"} <= set(cfg.algorithm.sampling_params.stop)
    assert (cfg.actor.model.tensor_model_parallel_size, cfg.actor.model.pipeline_model_parallel_size) == (1, 1)
    assert cfg.algorithm.adv_type == "grpo" and cfg.algorithm.group_size == 4 and cfg.algorithm.n_minibatches == 2
    assert cfg.data.rollout_batch_size == 512
    assert cfg.algorithm.shuffle_rollout is False
    assert cfg.algorithm.kl_beta == 0.001 and cfg.algorithm.ratio_clip_eps == 0.2
    assert cfg.runner.seq_length == 7096 and cfg.data.max_prompt_length == 4096
    assert cfg.tools.search.server_addr == "127.0.0.1:8000" and cfg.tools.search.topk == 3
    assert cfg.agentloop.agent == "searchr1"
    assert cfg.runner.save_interval == 25
    assert cfg.rollout.model.model_path == "/models/Qwen2.5-3B-Instruct"
    assert cfg.data.train_data_paths == ["/data/searchr1/train.jsonl"]
    # interpolations resolved through the chain
    assert cfg.actor.micro_batch_size == cfg.algorithm.training_batch_size_per_gpu


def test_eval_yaml_builds_on_training_yaml(reference_env):
    cfg = load_config("qwen2.5-3b-tool-1node-eval")
    assert cfg.runner.task_type == "reasoning_eval" and cfg.algorithm.group_size == 1
    assert cfg.algorithm.sampling_params.do_sample is False
    assert cfg.rollout.model.model_path == "/models/searchr1-step-200-hf"
    # the eval placement replaces (does not merge into) the training placement
    assert cfg.cluster.component_placement == {"rollout,reward": "all"}
    # Search-R1's one merged test set (preprocessed), grouped by data_source
    assert list(cfg.data.val_data_paths) == ["/data/searchr1/test.jsonl"]
    assert list(load_config("qwen2.5-3b-tool-1node").data.val_data_paths) == ["/data/searchr1/test.jsonl"]


def test_eval_yaml_evaluates_as_searchr1_s_evaluate_sh_and_training_as_its_training_scripts(reference_env):
    """scripts/nq_hotpotqa/evaluate.sh: max_turns=4, max_response_length=500, max_obs_length=500, topk 3, vLLM in
    bf16; train_grpo.sh / train_ppo.sh: max_turns=2; the same generation loop (an EOS without an action retried)
    in both (docs/searchr1-facts.md, "Evaluation at parity")."""
    cfg, train = load_config("qwen2.5-3b-tool-1node-eval"), load_config("qwen2.5-3b-tool-1node")
    loop = cfg.agentloop
    assert (loop.searchr1.max_turns, loop.searchr1.on_no_action, cfg.rollout.model.precision) == (4, "retry", "bf16")
    # every turn and observation at full length fits: 5 generated turns and 4 observations
    turns, obs = cfg.algorithm.sampling_params.max_new_tokens, loop.max_obs_length
    assert loop.response_length_total >= 5 * turns + 4 * obs == 4500
    assert cfg.runner.seq_length - cfg.data.max_prompt_length >= loop.response_length_total
    assert cfg.tools.search.topk == 3 and cfg.algorithm.sampling_params.do_sample is False
    assert (train.agentloop.searchr1.max_turns, train.agentloop.searchr1.on_no_action) == (2, "retry")


def test_tiny_assets_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RLINF_EXT_TINY_ASSETS", str(tmp_path))
    cfg = load_config("tiny-cpu")
    assert cfg.paths.tiny_assets == str(tmp_path)
    assert cfg.rollout.model.model_path == f"{tmp_path}/registry/models/qwen2-tiny-reader"
    assert cfg.retrieval.corpus_path == f"{tmp_path}/registry/corpus/wiki.jsonl"
    assert (cfg.data.rollout_batch_size, cfg.algorithm.group_size, cfg.algorithm.n_minibatches) == (8, 8, 2)


def test_tiny_assets_dir_default_is_under_repo(monkeypatch):
    monkeypatch.delenv("RLINF_EXT_TINY_ASSETS", raising=False)
    cfg = load_config("tiny-cpu")
    assert cfg.paths.tiny_assets == str(REPO_ROOT / "outputs" / "tiny_assets")


def test_missing_env_vars_are_reported_by_name(no_reference_env):
    result = check_config("qwen2.5-3b-tool-1node")
    by_key = {i.key: i for i in result.issues}
    assert set(by_key) == {
        "rollout.model.model_path",
        "data.train_data_paths",
        "data.val_data_paths",
        "tools.search.server_addr",
    }
    assert "RLINF_EXT_QWEN25_3B" in by_key["rollout.model.model_path"].reason
    assert "export RLINF_EXT_QWEN25_3B" in by_key["rollout.model.model_path"].fix


def test_tiny_config_resolves_with_real_assets(tiny_assets_registry, monkeypatch):
    """check_paths on the tiny eval experiment: every file it reads exists in the generated assets."""
    root = Path(tiny_assets_registry.root)
    monkeypatch.setenv("RLINF_EXT_TINY_ASSETS", str(root))
    result = check_config("tiny-cpu-eval", [], check_paths=True)
    assert result.ok, "\n".join(str(i) for i in result.issues)
    # tiny-cpu.yaml's actor dims are its warm start's
    import json

    reader = json.loads((root / "registry" / "models" / "qwen2-tiny-reader" / "config.json").read_text())
    actor = load_config("tiny-cpu").actor.model
    assert (
        reader["hidden_size"],
        reader["num_attention_heads"],
        reader["num_key_value_heads"],
        reader["intermediate_size"],
    ) == (actor.hidden_size, actor.num_attention_heads, actor.num_query_groups, actor.ffn_hidden_size)
    # the model preset's dims agree with the generated random model's config.json
    import yaml

    hf = json.loads((root / "models" / "qwen2-tiny" / "config.json").read_text())
    preset = yaml.safe_load((REPO_ROOT / "configs" / "model" / "qwen2-tiny.yaml").read_text())["actor"]["model"]
    assert (hf["num_attention_heads"], hf["num_key_value_heads"], hf["hidden_size"]) == (
        preset["num_attention_heads"],
        preset["num_query_groups"],
        preset["hidden_size"],
    )
    cfg = result.cfg.actor.model
    assert hf["hidden_size"] // hf["num_attention_heads"] == 32  # vLLM's CPU attention refuses 16
    assert (cfg.hidden_size // cfg.num_attention_heads, cfg.num_query_groups) == (32, 2)  # the warm start's


def test_resolved_dictconfig_for_rlinf(reference_env):
    dc = to_dictconfig(load_config("qwen2.5-3b-tool-1node"))
    assert dc.rollout.sglang.attention_backend == "triton"
    assert dc.rollout.vllm.enable_prefix_caching is True
    assert dc.critic.use_critic_model is False and dc.actor.megatron.distributed_backend == "nccl"  # compat values
    assert dc.runner.logger.log_path.endswith("/searchr1-grpo-qwen2.5-3b-tool-1node")
    assert dc.algorithm.sampling_params.max_new_tokens == 500
