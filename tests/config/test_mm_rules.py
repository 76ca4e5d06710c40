"""Config rules of the MMSearch-R1 sections."""

from __future__ import annotations

import pytest
from test_rules import assert_issue, issues_for

from rlinf_ext.config import check_config

# The GPU example YAMLs (and these tests' SGLang wiring) name rollout_backend=sglang, which validate accepts only
# where the SGLang profile is installed (tests/config/test_sglang_profile.py): validate as there.
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")


def test_mm_eval_configs_are_clean(reference_env):
    for name in ("tiny-mm-cpu-eval", "qwen2.5-vl-7b-eval"):
        by_key, result = issues_for(name, [])
        assert result.ok, [str(i) for i in result.issues]


@pytest.mark.slow
def test_the_agent_alone_chooses_its_data_and_reward(reference_env):
    assert_issue("tiny-mm-cpu-eval", ["reward.reward_type=searchr1"], "reward.reward_type", "unknown key")
    assert_issue("tiny-mm-cpu-eval", ["data.type=searchr1"], "data.type", "unknown key")
    assert_issue("tiny-cpu-eval", ["agentloop.agent=mmsearch"], "rollout.model.model_type", "vision-language")


@pytest.mark.slow
def test_mm_scoring_pixels_cache_and_training(reference_env):
    assert_issue("tiny-mm-cpu-eval", ["reward.scoring=f1"], "reward.scoring", "em")
    assert_issue(
        "tiny-mm-cpu-eval", ["agentloop.mmsearch.image_min_pixels=100"], "agentloop.mmsearch.image_min_pixels", "784"
    )
    # a key that moved into the agent's section: the error names its new place
    assert_issue(
        "tiny-mm-cpu-eval",
        ["data.image_min_pixels=3136"],
        "data.image_min_pixels",
        "agentloop.mmsearch.image_min_pixels",
    )
    assert_issue(
        "tiny-mm-cpu-eval",
        ["reward.format_penalty=0.1"],
        "reward.format_penalty",
        "agentloop.mmsearch.reward.format_penalty",
    )
    assert_issue(
        "tiny-mm-cpu-eval",
        ["tools.image_search.thumbnail_max_pixels=1000"],
        "tools.image_search.thumbnail_max_pixels",
        "3136",
    )
    assert_issue("tiny-mm-cpu-eval", ["tools.image_search.cache_path=null"], "tools.image_search.cache_path", "cache")
    by_key, result = issues_for("tiny-mm-cpu", [])  # MMSearch-R1 training validates (it used to be refused)
    assert result.ok, [str(i) for i in result.issues]
    by_key, _ = issues_for(
        "tiny-mm-cpu-eval", ["tools.image_search.backend=dummy", "tools.image_search.cache_path=null"]
    )
    assert "tools.image_search.cache_path" not in by_key


@pytest.mark.slow
def test_vl_actor_backend_rules(reference_env):
    by_key, result = issues_for("tiny-mm-cpu-eval", ["actor.training_backend=fsdp"])
    assert result.ok, [str(i) for i in result.issues]
    training = ["runner.task_type=reasoning", "data.train_data_paths=[x.parquet]"]
    assert_issue("tiny-mm-cpu-eval", training, "actor.training_backend", "fsdp")
    by_key, _ = issues_for("tiny-mm-cpu-eval", training + ["actor.training_backend=fsdp"])
    assert "actor.training_backend" not in by_key
    assert_issue("tiny-cpu-eval", ["actor.training_backend=fsdp"], "actor.training_backend", "megatron")
    assert_issue(
        "tiny-mm-cpu-eval",
        ["actor.training_backend=fsdp", "actor.fsdp_config.cpu_offload=true"],
        "actor.fsdp_config.cpu_offload",
        "false",
    )


def test_mm_stops_and_search_limits(reference_env):
    # a stop list without the loop's tags runs (the loop adds them) and is warned about
    stale = check_config("tiny-mm-cpu-eval", ["algorithm.sampling_params.stop=[</answer>]"])
    (warning,) = [w for w in stale.warnings if w.key == "algorithm.sampling_params.stop"]
    assert "missing ['</search>', '</text_search>']" in warning.reason and stale.ok
    assert_issue(
        "tiny-mm-cpu-eval",
        ["agentloop.mmsearch.image_search_limit=3"],
        "agentloop.mmsearch.image_search_limit",
        "max_gen_round=3",
        "between 0 and 2",
    )
    assert_issue(
        "tiny-mm-cpu-eval",
        ["agentloop.mmsearch.max_gen_round=2", "agentloop.mmsearch.text_search_limit=2"],
        "agentloop.mmsearch.text_search_limit",
        "between 0 and 1",
    )
    by_key, _ = issues_for("tiny-mm-cpu-eval", ["agentloop.mmsearch.image_search_limit=2"])
    assert "agentloop.mmsearch.image_search_limit" not in by_key


def test_fsdp_actor_collocates_with_offload(reference_env):
    """The FSDP2 actor offloads like the Megatron one: collocated GPUs need both offload flags; on disjoint GPUs
    the flags would free nothing."""
    by_key, result = issues_for("qwen2.5-vl-7b-1node", [])
    assert result.ok, [str(i) for i in result.issues]
    collocated = ["cluster.component_placement={'actor,rollout,reward': all}"]
    assert_issue(
        "qwen2.5-vl-7b-1node",
        collocated,
        "actor.offload_weight",
        "collocated",
        "actor.offload_weight=true actor.offload_optimizer=true",
    )
    _, result = issues_for(
        "qwen2.5-vl-7b-1node",
        collocated + ["actor.offload_weight=true", "actor.offload_optimizer=true", "actor.offload_grad=true"],
    )
    assert not [i for i in result.issues if i.key.startswith(("actor.offload", "cluster.component_placement"))], [
        str(i) for i in result.issues
    ]
    assert_issue("qwen2.5-vl-7b-1node", ["actor.offload_weight=true"], "actor.offload_weight", "disjoint GPUs")
    assert_issue("tiny-mm-cpu", ["actor.offload_weight=true"], "actor.offload_weight", "CPU cluster")
    assert_issue("qwen2.5-vl-7b-1node", ["algorithm.training_batch_size_per_gpu=8"], "runner.seq_length", "GiB")
