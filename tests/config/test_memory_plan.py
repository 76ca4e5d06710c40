"""Memory you can see before you launch: `rlinf-ext plan` prints the per-GPU estimate, `validate` refuses a config
that does not fit and names the keys that would make it fit; the actor's Megatron knobs are checked for
consistency; RLinf keys the actor does not implement are refused."""

from __future__ import annotations

import pytest

from rlinf_ext.config import check_config, load_config
from rlinf_ext.config.commands import format_plan
from rlinf_ext.config.memory_plan import gpu_plan, memory_inputs
from rlinf_ext.models.memory import GIB

# The GPU example YAMLs (and these tests' SGLang wiring) name rollout_backend=sglang, which validate accepts only
# where the SGLang profile is installed (tests/config/test_sglang_profile.py): validate as there.
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")

REFERENCE = "qwen2.5-3b-tool-1node"


def issue_on(name, overrides, key):
    result = check_config(name, overrides)
    by_key = {i.key: i for i in result.issues}
    assert key in by_key, f"expected an issue on {key}, got {[str(i) for i in result.issues]}"
    return by_key[key]


def test_the_reference_run_fits_80_gib_at_its_seq_length_and_plan_prints_the_figures(reference_env):
    cfg = load_config(REFERENCE)
    assert cfg.runner.seq_length == 7096 and cfg.cluster.gpu_memory_gib == 80
    x, source = memory_inputs(cfg)
    assert source == "actor.model (preset)" and x.data_parallel == 8 and x.flash_attention and x.distributed_optimizer
    plan = gpu_plan(cfg, x)
    assert plan.collocated and plan.fits and plan.training_phase < 60 * GIB
    text = format_plan(cfg)
    for line in ("memory per GPU", "3.09B params", "recompute full/block/20", "actor optimizer state",
                 "actor log-prob chunk", "GPU, training phase", "GPU, rollout phase (engine 0.75", "fits cluster.gpu_memory_gib=80: yes"):
        assert line in text, line


def test_a_config_that_does_not_fit_is_refused_with_the_keys_that_make_it_fit(reference_env):
    # Megatron's local layers materialise [16, 7096, 7096] attention per layer
    issue = issue_on(REFERENCE, ["actor.spec_name=local_gpt"], "runner.seq_length")
    assert "over cluster.gpu_memory_gib=80" in issue.reason and "runner.seq_length=7096" in issue.reason
    for fix in ("actor.spec_name=decoder_gpt", "actor.model.recompute_method=uniform", "runner.seq_length="):
        assert fix in issue.fix, fix
    # each suggestion really fits
    seq = int(issue.fix.split("runner.seq_length=")[1].split()[0])
    assert check_config(REFERENCE, ["actor.spec_name=local_gpt", f"runner.seq_length={seq}",
                                    "agentloop.response_length_total=2000", "data.max_prompt_length=1024"]).ok
    assert check_config(REFERENCE, ["actor.spec_name=local_gpt", "actor.model.recompute_method=uniform",
                                    "actor.model.recompute_num_layers=1"]).ok
    assert "NO" in format_plan(load_config(REFERENCE, ["actor.spec_name=local_gpt"], strict=False))


def test_collocated_without_offload_does_not_fit_while_the_engine_generates(reference_env):
    overrides = ["actor.offload_weight=false", "actor.offload_optimizer=false", "actor.offload_grad=false"]
    issue = issue_on(REFERENCE, overrides, "rollout.gpu_memory_utilization")
    assert "rollout phase" in issue.reason
    assert "actor.offload_weight=true actor.offload_optimizer=true actor.offload_grad=true" in issue.fix
    assert "rollout.gpu_memory_utilization=0." in issue.fix
    # on GPUs of its own (disaggregated) the actor keeps everything
    assert check_config(REFERENCE, overrides + ["cluster.component_placement={actor: 0-3, 'rollout,reward': 4-7}",
                                                "data.rollout_batch_size=512"]).ok


def test_smaller_gpus_and_cpu_clusters(reference_env):
    issue = issue_on(REFERENCE, ["cluster.gpu_memory_gib=40"], "runner.seq_length")
    assert "cluster.gpu_memory_gib=40" in issue.reason
    assert "memory per GPU" not in format_plan(load_config("tiny-cpu"))  # no GPU: nothing to fit


@pytest.mark.parametrize("overrides, key, words", [
    (["actor.model.recompute_method=null"], "actor.model.recompute_method", "needs a method"),
    (["actor.model.recompute_num_layers=40"], "actor.model.recompute_num_layers", "1..36"),
    (["actor.model.recompute_granularity=null"], "actor.model.recompute_granularity", "do nothing"),
    (["actor.model.recompute_granularity=selective", "actor.model.recompute_method=null"],
     "actor.model.recompute_num_layers", "remove actor.model.recompute_num_layers"),
    (["actor.optim.optimizer=sgd"], "actor.optim.use_distributed_optimizer", "Adam only"),
    (["actor.model.activation=gelu"], "actor.model.activation", "config.json"),
    (["actor.megatron.distributed_backend=gloo"], "actor.megatron.distributed_backend", "nccl"),
    (["actor.megatron.ckpt_format=torch_dist"], "actor.megatron.ckpt_format", "legacy torch layout"),
    (["actor.model.seq_length=4096"], "actor.model.seq_length", "runner.seq_length=7096"),
])
def test_megatron_knobs_are_checked(reference_env, overrides, key, words):
    issue = issue_on(REFERENCE, overrides, key)
    assert words in f"{issue.reason} {issue.fix}"


def test_fused_kernels_are_refused_on_a_cpu_cluster_only(reference_env):
    issue = issue_on("tiny-cpu", ["actor.model.bias_activation_fusion=true"], "actor.model.bias_activation_fusion")
    assert "CUDA-only" in issue.reason
    assert check_config(REFERENCE, ["actor.model.bias_activation_fusion=true"]).ok
    assert check_config("tiny-cpu", ["actor.optim.optimizer=sgd"]).ok  # ZeRO shards SGD on CPU
