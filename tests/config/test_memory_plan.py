"""Memory you can see before you launch: `rlinf-ext plan` prints the per-GPU estimate, `validate` refuses a config
that does not fit and names the keys that would make it fit; the actor's Megatron knobs are checked for
consistency; RLinf keys the actor does not implement are refused."""

from __future__ import annotations

import re

import pytest

from rlinf_ext.config import check_config, load_config
from rlinf_ext.config.commands import format_plan
from rlinf_ext.config.memory_plan import engine_plan, gpu_plan, memory_inputs, model_shape
from rlinf_ext.models.memory import (
    CUDA_RESERVE_BYTES,
    GIB,
    ROLLOUT_RESIDENT_BYTES,
    VLLM_ASLEEP_RESIDENT_BYTES,
    VLLM_CUDA_CONTEXT_BYTES,
    VLLM_RUNTIME_BYTES,
    ModelShape,
    engine_memory,
    vision_tower_params,
)

# The GPU example YAMLs (and these tests' SGLang wiring) name rollout_backend=sglang, which validate accepts only
# where the SGLang profile is installed (tests/config/test_sglang_profile.py): validate as there.
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")

REFERENCE = "qwen2.5-3b-tool-1node"
VL_REFERENCE = "qwen2.5-vl-7b-1node"
QWEN25_3B = ModelShape(num_layers=36, hidden=2048, ffn=11008, heads=16, groups=2, head_dim=128, vocab=151936, tied=True)
# Qwen2.5-VL's vision tower, by hand: patch embedding 3*2*14*14*1280 = 1,505,280; a block 2*1280 (norms)
# + 1280*3840+3840 (qkv) + 1280*1280+1280 (proj) + 3*1280*3420+2*3420+1280 (gated MLP) = 19,702,200, x 32;
# merger 1280 (norm) + 5120*5120+5120 + 5120*3584+3584 = 44,574,464
QWEN25_VL_7B_VISION = 1_505_280 + 32 * 19_702_200 + 44_574_464  # 676,550,144
# the 3B's fp16 embedding, its largest tensor: 151936 x 2048 x 2 bytes
QWEN25_3B_EMBEDDING_BYTES = 622_329_856
# Qwen2.5-VL-7B by hand: 2 x 152064 x 3584 (embedding and output layer, untied) + 28 layers x (3584 x 4608 + 4608
# (q/k/v and their biases) + 3584 x 3584 (o) + 3 x 3584 x 18944 (MLP) + 2 x 3584 (norms)) + 3584 (final norm)
# = 7,615,616,512, + the vision tower 676,550,144 = 8,292,166,656 (the checkpoint's count)
QWEN25_VL_7B_PARAMS = 8_292_166_656
# what an 80 GiB GPU gives CUDA: the table's figure (models/gpu_capacity.py), which every phase is checked against
USABLE_80 = int(79.14 * GIB)
FITS_80 = "fits the 79.14 GiB a GPU of cluster.gpu_memory_gib=80 gives CUDA (A100 / H100 80GB: the table's figure): yes"


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
    # the sync, by hand: the engine asleep (1 GiB) + fp16 weights + runtime pools (2 GiB) + its copies (a 1 GiB
    # buffer of clones + 2 embeddings); the actor's CUDA context + the 1 GiB packed IPC buffer + 2 embeddings
    weights = QWEN25_3B.params * 2
    engine = VLLM_ASLEEP_RESIDENT_BYTES + weights + VLLM_RUNTIME_BYTES + GIB + 2 * QWEN25_3B_EMBEDDING_BYTES
    assert plan.sync_phase == engine + CUDA_RESERVE_BYTES + GIB + 2 * QWEN25_3B_EMBEDDING_BYTES  # 14.07 GiB
    # vLLM takes its fraction of what the GPU gives CUDA: 0.75 x 79.14 + 0.5 + 1 = 60.85 GiB
    assert plan.rollout_phase == int(0.75 * USABLE_80) + VLLM_CUDA_CONTEXT_BYTES + CUDA_RESERVE_BYTES
    # host RAM of one offloaded rank: fp16 weights and reference (2n each), fp32 main params and Adam moments
    # sharded over 8 (4n/8 + 8n/8): 5.5n = 15.81 GiB; the sleeping engine's runtime and CUDA-graph pools
    assert plan.actor_host == 11 * QWEN25_3B.params // 2 and plan.engine.host_asleep == VLLM_RUNTIME_BYTES
    text = format_plan(cfg)
    for line in (
        "memory per GPU",
        "3.09B params",
        "recompute full/block/20",
        "actor optimizer state",
        "actor log-prob chunk",
        "engine share (vllm: 0.75 x 79.14)",
        "engine KV cache",
        "engine CUDA context (beside its share)",
        "engine asleep (while the actor trains, sleep level 2)",
        "GPU, training phase (actor peak + engine asleep)",
        "GPU, weight-sync phase (engine without its KV cache + actor + transfer)",
        "actor transfer buffers (vLLM's packed IPC buffer)",
        "GPU, rollout phase (engine + its CUDA context + what the actor keeps)",
        "host RAM per node, actor offload: 8 x 15.81",
        "host RAM per node, engines asleep (level 2 backs up the runtime and CUDA-graph pools): 8 x 2.00",
        FITS_80,
    ):
        assert line in text, line
    rows = _rows(text)
    assert rows["GPU, weight-sync phase (engine without its KV cache + actor + transfer)"] == "14.07 of 79.14"
    assert rows["GPU, rollout phase (engine + its CUDA context + what the actor keeps)"] == "60.85 of 79.14"
    both = 8 * 5.5 * QWEN25_3B.params / GIB + 8 * 2
    assert rows["host RAM per node, both (their sum: an upper bound)"] == f"{both:.2f}"  # 142.46


def _rows(text: str) -> dict[str, str]:
    """The plan's memory rows: label -> value (they are apart by two spaces or more)."""
    pairs = (re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in text.splitlines() if line.startswith("  "))
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}


def test_a_config_that_does_not_fit_is_refused_with_the_keys_that_make_it_fit(reference_env):
    # Megatron's local layers materialise [16, 7096, 7096] attention per layer
    issue = issue_on(REFERENCE, ["actor.spec_name=local_gpt"], "runner.seq_length")
    assert "over the 79.14 GiB a GPU of cluster.gpu_memory_gib=80 gives CUDA" in issue.reason
    assert "runner.seq_length=7096" in issue.reason
    for fix in ("actor.spec_name=decoder_gpt", "actor.model.recompute_method=uniform", "runner.seq_length="):
        assert fix in issue.fix, fix
    # each suggestion really fits
    seq = int(issue.fix.split("runner.seq_length=")[1].split()[0])
    assert check_config(
        REFERENCE,
        [
            "actor.spec_name=local_gpt",
            f"runner.seq_length={seq}",
            "agentloop.response_length_total=2000",
            "data.max_prompt_length=1024",
        ],
    ).ok
    assert check_config(
        REFERENCE,
        ["actor.spec_name=local_gpt", "actor.model.recompute_method=uniform", "actor.model.recompute_num_layers=1"],
    ).ok
    assert "NO" in format_plan(load_config(REFERENCE, ["actor.spec_name=local_gpt"], strict=False))


def test_collocated_without_offload_does_not_fit_while_the_engine_generates(reference_env):
    overrides = ["actor.offload_weight=false", "actor.offload_optimizer=false", "actor.offload_grad=false"]
    issue = issue_on(REFERENCE, overrides, "rollout.gpu_memory_utilization")
    assert "rollout phase" in issue.reason
    assert "actor.offload_weight=true actor.offload_optimizer=true actor.offload_grad=true" in issue.fix
    assert "rollout.gpu_memory_utilization=0." in issue.fix
    # on GPUs of its own (disaggregated) the actor keeps everything
    assert check_config(
        REFERENCE,
        overrides + ["cluster.component_placement={actor: 0-3, 'rollout,reward': 4-7}", "data.rollout_batch_size=512"],
    ).ok


def test_smaller_gpus_and_cpu_clusters(reference_env):
    issue = issue_on(REFERENCE, ["cluster.gpu_memory_gib=40"], "runner.seq_length")
    assert "cluster.gpu_memory_gib=40" in issue.reason
    assert "memory per GPU" not in format_plan(load_config("tiny-cpu"))  # no GPU: nothing to fit


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["actor.model.recompute_method=null"], "actor.model.recompute_method", "needs a method"),
        (["actor.model.recompute_num_layers=40"], "actor.model.recompute_num_layers", "1..36"),
        (["actor.model.recompute_granularity=null"], "actor.model.recompute_granularity", "do nothing"),
        (
            ["actor.model.recompute_granularity=selective", "actor.model.recompute_method=null"],
            "actor.model.recompute_num_layers",
            "remove actor.model.recompute_num_layers",
        ),
        (["actor.optim.optimizer=sgd"], "actor.optim.use_distributed_optimizer", "Adam only"),
        (["actor.model.activation=gelu"], "actor.model.activation", "config.json"),
        (["actor.megatron.distributed_backend=gloo"], "actor.megatron.distributed_backend", "nccl"),
        (["actor.megatron.ckpt_format=torch_dist"], "actor.megatron.ckpt_format", "legacy torch layout"),
        (["actor.model.seq_length=4096"], "actor.model.seq_length", "set runner.seq_length"),
    ],
)
def test_megatron_knobs_are_checked(reference_env, overrides, key, words):
    issue = issue_on(REFERENCE, overrides, key)
    assert words in f"{issue.reason} {issue.fix}"


def test_fused_kernels_are_refused_on_a_cpu_cluster_only(reference_env):
    issue = issue_on("tiny-cpu", ["actor.model.bias_activation_fusion=true"], "actor.model.bias_activation_fusion")
    assert "CUDA-only" in issue.reason
    assert check_config(REFERENCE, ["actor.model.bias_activation_fusion=true"]).ok
    assert check_config("tiny-cpu", ["actor.optim.optimizer=sgd"]).ok  # ZeRO shards SGD on CPU


# ------------------------------------------------------------------------------------------ the engine's share
def test_vllm_engine_share_by_hand():
    gpu = 80 * GIB
    e = engine_memory(QWEN25_3B, gpu_bytes=gpu, fraction=0.75, dtype_bytes=2)
    assert e.budget == 60 * GIB and e.weights == QWEN25_3B.params * 2 and e.runtime == VLLM_RUNTIME_BYTES
    assert e.kv_per_token == 2 * 36 * 2 * 128 * 2  # K and V, 36 layers, 2 KV heads of 128, fp16: 36 KiB
    assert e.kv_cache == 60 * GIB - QWEN25_3B.params * 2 - VLLM_RUNTIME_BYTES
    assert e.kv_tokens == e.kv_cache // 36864 and e.asleep == VLLM_ASLEEP_RESIDENT_BYTES
    # its CUDA context beside the fraction; asleep at level 2 the runtime and CUDA-graph pools in host RAM
    assert e.outside == VLLM_CUDA_CONTEXT_BYTES and e.host_asleep == VLLM_RUNTIME_BYTES
    # TP 2: half the weights and one KV head per GPU; sleep level 1 keeps this GPU's weights in host RAM too
    e2 = engine_memory(QWEN25_3B, gpu_bytes=gpu, fraction=0.75, dtype_bytes=2, tensor_parallel=2, sleep_level=1)
    assert e2.weights == QWEN25_3B.params and e2.kv_per_token == 36864 // 2
    assert e2.host_asleep == e2.weights + VLLM_RUNTIME_BYTES
    # 4 KV-replicating GPUs for 2 heads: still one head each
    assert (
        engine_memory(QWEN25_3B, gpu_bytes=gpu, fraction=0.75, dtype_bytes=2, tensor_parallel=4).kv_per_token == 18432
    )
    # smallest fraction that caches 10,000 tokens: (weights + runtime + 10,000 x 36 KiB) / 80 GiB, rounded up
    need = (QWEN25_3B.params * 2 + VLLM_RUNTIME_BYTES + 10_000 * 36864) / gpu
    assert e.min_fraction(10_000) == pytest.approx(-(-need * 100 // 1) / 100) and e.min_fraction(10_000) >= need


def test_vision_tower_count_matches_transformers():
    assert vision_tower_params() == QWEN25_VL_7B_VISION == 676_550_144
    assert vision_tower_params(out_hidden=2048) == QWEN25_VL_7B_VISION - 5120 * 1536 - 1536  # 3B: merger to 2048
    torch = pytest.importorskip("torch")
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    with torch.device("meta"):
        tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(
            Qwen2_5_VLVisionConfig(
                depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584
            )
        )
    assert sum(p.numel() for p in tower.parameters()) == QWEN25_VL_7B_VISION


def test_vl_plan_counts_the_vision_tower_and_the_engine_share(reference_env):
    cfg = load_config(VL_REFERENCE, ["rollout.rollout_backend=vllm"], strict=False)
    shape, source = model_shape(cfg)
    assert source == "actor.model (preset)" and shape.vision_params == QWEN25_VL_7B_VISION
    x, _ = memory_inputs(cfg)
    # FSDP2 over 4 ranks: fp32 weights, gradients and Adam moments of language model + vision tower, sharded
    total = shape.params + QWEN25_VL_7B_VISION
    plan = gpu_plan(cfg, x)
    assert plan.actor.items["weights"] == total * 4 // 4 and plan.actor.items["optimizer state"] == total * 8 // 4
    e = engine_plan(cfg, shape)
    # the engine on a GPU of its own: 0.6 x 79.14 GiB for bf16 weights of both towers, runtime and the KV cache of
    # 28 layers x 4 KV heads x 128, and its CUDA context beside it
    assert e.budget == int(0.6 * USABLE_80) and e.weights == total * 2 and e.kv_per_token == 2 * 28 * 4 * 128 * 2
    assert not plan.collocated and plan.rollout_phase == e.budget + VLLM_CUDA_CONTEXT_BYTES
    assert plan.sync_phase == 0 and plan.actor_host == 0  # disaggregated: no collocated sync, no offload
    text = format_plan(cfg)
    for line in (
        "7.62B params + vision tower 0.68B",
        "engine share (vllm: 0.6 x 79.14)",
        "engine weights (bf16)",
        f"{total * 2 / GIB:7.2f}",
        f"engine KV cache ({e.kv_tokens:,} tokens",
        "rollout GPUs",
    ):
        assert line in text, line
    # disaggregated: the engine never sleeps, the actor offloads nothing (rank 0's gather: the test below)
    assert "engine asleep" not in text and "host RAM per node" not in text


def test_collocated_vl_plan_counts_the_vision_tower_and_the_sleeping_engine(reference_env):
    """qwen2.5-vl-7b-1node-collocated: FSDP2 over all 8 GPUs beside the engine; training phase = the actor's peak +
    what the sleeping engine keeps, rollout phase = the engine's share + what the offloaded actor keeps."""
    name = "qwen2.5-vl-7b-1node-collocated"
    assert check_config(name).ok
    cfg = load_config(name)
    shape, _ = model_shape(cfg)
    x, _ = memory_inputs(cfg)
    total = shape.params + QWEN25_VL_7B_VISION
    plan = gpu_plan(cfg, x)
    assert x.data_parallel == 8 and plan.actor.items["weights"] == total * 4 // 8
    e = engine_plan(cfg, shape)
    # level 2: the runtime and CUDA-graph pools go to host RAM, the weights are discarded
    assert e.weights == total * 2 and e.asleep == VLLM_ASLEEP_RESIDENT_BYTES and e.host_asleep == VLLM_RUNTIME_BYTES
    assert plan.collocated and plan.fits
    assert plan.training_phase == plan.actor.peak + VLLM_ASLEEP_RESIDENT_BYTES
    # offloaded: only the actor's CUDA context stays beside the engine's share and the engine's context
    assert plan.rollout_phase == int(0.6 * USABLE_80) + VLLM_CUDA_CONTEXT_BYTES + CUDA_RESERVE_BYTES
    # the sync: the FSDP2 shards come back for the gathers (fp32, 1/8 each) and the largest parameter (the
    # 152064 x 3584 embedding) is gathered whole in fp32 and cast to bf16; the 1 GiB buffer must grow to hold
    # that embedding in bf16 (1,089,994,752 bytes), on the actor's side and in the engine's clones
    embedding = 152064 * 3584
    assert plan.sync_onloaded == total * 4 // 8 and plan.transfer.conversion == embedding * 6
    assert plan.transfer.buffers == embedding * 2 > GIB
    engine = VLLM_ASLEEP_RESIDENT_BYTES + e.weights + VLLM_RUNTIME_BYTES + embedding * 2 + 2 * embedding * 2
    assert plan.sync_phase == engine + CUDA_RESERVE_BYTES + total * 4 // 8 + embedding * 2 + embedding * 6
    text = format_plan(cfg)
    for line in (
        "7.62B params + vision tower 0.68B",
        "FSDP2 over DP 8",
        "engine share (vllm: 0.6 x 79.14)",
        "engine asleep (while the actor trains, sleep level 2)",
        "actor weight shards brought back",
        "the largest parameter gathered whole in fp32",
        FITS_80,
    ):
        assert line in text, line
    rows = {k: v for k, v in _rows(text).items() if k.startswith("GPU, ")}
    assert rows == {
        "GPU, training phase (actor peak + engine asleep)": f"{plan.training_phase / GIB:.2f} of 79.14",
        "GPU, weight-sync phase (engine without its KV cache + actor + transfer)": f"{plan.sync_phase / GIB:.2f} of 79.14",
        "GPU, rollout phase (engine + its CUDA context + what the actor keeps)": f"{plan.rollout_phase / GIB:.2f} of 79.14",
    }
    # without the offload flags the actor's state stays beside the engine's share while it generates
    kept = gpu_plan(cfg, x, offload_weight=False, offload_optimizer=False, offload_grad=False)
    assert kept.rollout_phase == plan.rollout_phase + sum(
        plan.actor.items[k]
        for k in ("weights", "reference model", "main params (fp32)", "optimizer state", "gradients")
    )


def test_collocated_refused_when_actor_peak_and_the_sleeping_engine_exceed_the_gpu(reference_env):
    cfg = load_config(REFERENCE)
    peak = gpu_plan(cfg, memory_inputs(cfg)[0]).actor.peak
    # a GPU the actor's step fits alone but not beside what the sleeping engine keeps (1 GiB); a size the table
    # lacks gives CUDA 98% of it (models/gpu_capacity.py)
    gib = (peak + VLLM_ASLEEP_RESIDENT_BYTES // 2) / 0.98 / GIB
    assert peak < 0.98 * gib * GIB < peak + VLLM_ASLEEP_RESIDENT_BYTES
    issue = issue_on(REFERENCE, [f"cluster.gpu_memory_gib={gib:.4f}"], "runner.seq_length")
    assert "training phase" in issue.reason and "GiB the sleeping engine keeps" in issue.reason
    small = load_config(REFERENCE, [f"cluster.gpu_memory_gib={gib:.4f}"], strict=False)
    plan = gpu_plan(small, memory_inputs(small)[0])
    assert plan.training_phase == peak + VLLM_ASLEEP_RESIDENT_BYTES and plan.rollout_phase < plan.gpu_bytes


def test_sleep_level_1_counts_host_ram_per_node(reference_env):
    cfg = load_config(REFERENCE, ["rollout.vllm.sleep_level=1"])
    e = engine_plan(cfg, model_shape(cfg)[0])
    assert e.host_asleep == e.weights + VLLM_RUNTIME_BYTES  # 5.75 + 2 GiB per engine
    text = format_plan(cfg)
    assert "engines asleep (level 1 backs up weights, runtime and CUDA-graph pools): 8 x 7.75" in text
    assert (
        _rows(text)["host RAM per node, both (their sum: an upper bound)"]
        == f"{(8 * 5.5 * QWEN25_3B.params + 8 * e.host_asleep) / GIB:.2f}"
    )


def test_sglang_collocated_sync_and_host_ram(reference_env):
    """SGLang's collocated route: RLinf's buckets (a bucket and the tensors packed into it), the engine's weights
    resumed beside what it keeps released, no host copy of a released engine."""
    cfg = load_config(REFERENCE, ["rollout.rollout_backend=sglang"])
    x, _ = memory_inputs(cfg)
    plan = gpu_plan(cfg, x)
    weights = QWEN25_3B.params * 2
    assert plan.engine.updating == ROLLOUT_RESIDENT_BYTES + weights
    assert (
        plan.sync_phase
        == ROLLOUT_RESIDENT_BYTES + weights + CUDA_RESERVE_BYTES + 2 * GIB + 2 * QWEN25_3B_EMBEDDING_BYTES
    )
    text = format_plan(cfg)
    assert "actor transfer buffers (a bucket and the tensors packed into it)" in text
    assert "engines asleep (SGLang keeps no copy): 8 x 0.00" in text


def test_a_sync_phase_over_the_gpu_is_refused_and_no_fraction_is_suggested(reference_env):
    """The collocated 7B VL run with one micro-batch on 30 GiB (29.40 GiB for CUDA, 98%: no table figure): training
    (28.1) and rollout (19.1) fit, the sync does not (the engine's 15.5 GiB of weights awake beside the FSDP2 shards
    and the transfer memory: 30.4). A lower fraction cannot help: the KV cache is asleep during the sync."""
    name = "qwen2.5-vl-7b-1node-collocated"
    base = ["algorithm.training_batch_size_per_gpu=1", "cluster.gpu_memory_gib=30"]
    cfg = load_config(name, base, strict=False)
    plan = gpu_plan(cfg, memory_inputs(cfg)[0])
    assert plan.gpu_bytes == int(0.98 * 30 * GIB)
    assert plan.training_phase < plan.gpu_bytes and plan.rollout_phase < plan.gpu_bytes < plan.sync_phase
    issue = issue_on(name, base, "rollout.tensor_parallel_size")  # offload is on already
    assert "weight-sync phase" in issue.reason and "KV cache asleep" in issue.reason
    assert "rollout.gpu_memory_utilization does not help" in issue.fix and "actor.offload" not in issue.fix
    # with the rollout phase over too (0.99 x 29.40 + the two CUDA contexts = 30.6 GiB), the fraction that fits the
    # rollout phase alone (0.94) is no fix: the sync still does not fit
    over = issue_on(name, base + ["rollout.gpu_memory_utilization=0.99"], "rollout.gpu_memory_utilization")
    assert "rollout phase" in over.reason and "so is the weight-sync phase (30.4 GiB)" in over.reason
    assert "rollout.gpu_memory_utilization=0." not in over.fix and "does not help" in over.fix
    assert check_config(name, ["algorithm.training_batch_size_per_gpu=1", "cluster.gpu_memory_gib=32"]).ok


def test_an_engine_fraction_without_room_for_one_sequence_is_refused_with_the_fraction_that_fits(reference_env):
    overrides = ["rollout.rollout_backend=vllm", "rollout.gpu_memory_utilization=0.2"]
    issue = issue_on(VL_REFERENCE, overrides, "rollout.gpu_memory_utilization")
    assert "the engine would not start" in issue.reason and "runner.seq_length=10240" in issue.reason
    cfg = load_config(VL_REFERENCE, overrides, strict=False)
    e = engine_plan(cfg, model_shape(cfg)[0])
    # (bf16 weights + runtime + 10240 tokens x 56 KiB) / 79.14 GiB = 0.2273...: 0.23
    assert e.weights + e.runtime + 10240 * 57344 == pytest.approx(0.2273 * USABLE_80, rel=1e-3)
    assert "rollout.gpu_memory_utilization=0.23" in issue.fix and "rollout.tensor_parallel_size=2" in issue.fix
    fixed = check_config(VL_REFERENCE, ["rollout.rollout_backend=vllm", "rollout.gpu_memory_utilization=0.23"])
    assert "rollout.gpu_memory_utilization" not in {i.key for i in fixed.issues}


# ------------------------------------------------------------------------------------------ host RAM, usable memory
RANK0_GATHER = "host RAM, actor rank 0: the weight sync's full-state gather (fp32 + its bf16 cast)"


def test_disaggregated_fsdp2_plan_counts_rank_0s_host_gather(reference_env):
    """Disaggregated, FSDP2's rank 0 sends alone (vLLM's NCCL route, SGLang's group): ``hf_state_dict`` gathers the
    full fp32 state to its host RAM and casts it to the rollout's bf16 while the fp32 copy is alive:
    8,292,166,656 x (4 + 2) = 49,752,999,936 bytes = 46.34 GiB."""
    for overrides in ([], ["rollout.rollout_backend=vllm"]):
        cfg = load_config(VL_REFERENCE, overrides, strict=False)
        assert _rows(format_plan(cfg))[RANK0_GATHER] == "46.34"
        assert gpu_plan(cfg, memory_inputs(cfg)[0]).rank0_host == QWEN25_VL_7B_PARAMS * 6 == 49_752_999_936
    # collocated, each rank streams its own engine's weights a tensor at a time; Megatron converts on the GPU
    for name, overrides in (
        ("qwen2.5-vl-7b-1node-collocated", []),
        (REFERENCE, ["cluster.component_placement={actor: 0-3, 'rollout,reward': 4-7}"]),
    ):
        cfg = load_config(name, overrides, strict=False)
        assert gpu_plan(cfg, memory_inputs(cfg)[0]).rank0_host == 0
        assert RANK0_GATHER not in format_plan(cfg)


def test_a_phase_that_fits_the_nominal_size_but_not_the_usable_memory_is_refused(reference_env):
    """An 80 GiB GPU gives CUDA 79.14 GiB (``models/gpu_capacity.py``): a training phase of 79.74 GiB fits the nominal
    size, not the GPU."""
    overrides = ["algorithm.training_batch_size_per_gpu=2", "runner.seq_length=14008"]
    cfg = load_config(REFERENCE, overrides, strict=False)
    plan = gpu_plan(cfg, memory_inputs(cfg)[0])
    assert 79.14 * GIB < plan.training_phase < 80 * GIB
    issue = issue_on(REFERENCE, overrides, "runner.seq_length")
    assert "training phase" in issue.reason and "79.14 GiB" in issue.reason


def test_the_plan_reads_this_nodes_gpu_of_the_configured_kind(reference_env, monkeypatch):
    from rlinf_ext.config import memory_plan

    monkeypatch.setattr(memory_plan, "local_gpu_total_bytes", lambda: int(79.3 * GIB))
    cfg = load_config(REFERENCE)
    assert gpu_plan(cfg, memory_inputs(cfg)[0]).gpu_bytes == int(79.3 * GIB)
    assert (
        "fits the 79.30 GiB a GPU of cluster.gpu_memory_gib=80 gives CUDA (read from this node's GPU): yes"
        in format_plan(cfg)
    )
    # an H200 node validating an 80 GiB config: the table's figure for 80
    monkeypatch.setattr(memory_plan, "local_gpu_total_bytes", lambda: int(139.8 * GIB))
    assert gpu_plan(cfg, memory_inputs(cfg)[0]).gpu_bytes == USABLE_80
