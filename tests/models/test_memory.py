"""The actor memory estimate (models/memory.py), checked against hand-computed figures."""

import pytest

from rlinf_ext.models.memory import (
    BUCKET_BYTES,
    CUDA_FRAGMENTATION,
    CUDA_RESERVE_BYTES,
    GIB,
    ROLLOUT_RESIDENT_BYTES,
    ROLLOUT_WORKSPACE_BYTES,
    VLLM_ASLEEP_RESIDENT_BYTES,
    VLLM_CUDA_CONTEXT_BYTES,
    VLLM_RUNTIME_BYTES,
    ActorMemoryInputs,
    ModelShape,
    SyncTransfer,
    activation_bytes,
    engine_memory,
    estimate_actor,
    logits_bytes,
    plan_gpu,
    static_bytes,
    sync_transfer,
    transfer_buffer_bytes,
)

QWEN25_3B = ModelShape(num_layers=36, hidden=2048, ffn=11008, heads=16, groups=2, head_dim=128, vocab=151936, tied=True)
QWEN25_VL_7B_TEXT = ModelShape(
    num_layers=28, hidden=3584, ffn=18944, heads=28, groups=4, head_dim=128, vocab=152064, tied=False
)
# small enough to compute by hand: h=8, 2 heads of 4, 1 KV group, ffn 16, vocab 10
SMALL = ModelShape(num_layers=2, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10, tied=False)


def test_parameter_counts_are_the_published_ones():
    # per layer: qkv 2048*2560 + 2560, proj 2048*2048, MLP 3*2048*11008, two norms 2*2048 = 77 076 992
    assert QWEN25_3B.params == 151936 * 2048 + 36 * 77_076_992 + 2048 == 3_085_938_688  # "3.09B"
    half = ModelShape(24, 896, 4864, 14, 2, 64, 151936, True)
    assert half.params == 494_032_768  # Qwen2.5-0.5B: "0.49B"
    # SMALL: emb 80 + lm head 80; layer: qkv 8*16 + 16, proj 8*8, MLP 3*8*16, norms 16 = 608; final norm 8
    assert SMALL.params == 80 + 80 + 2 * 608 + 8 == 1384


def test_parameter_count_matches_a_real_checkpoint(tiny_assets):
    from safetensors.torch import load_file

    from rlinf_ext.models.qwen2 import dims_from_hf_config

    d = dims_from_hf_config(tiny_assets.qwen2_tiny)
    shape = ModelShape(
        d.num_layers,
        d.hidden_size,
        d.ffn_hidden_size,
        d.num_attention_heads,
        d.num_query_groups,
        d.head_dim,
        d.vocab_size,
        d.tie_word_embeddings,
    )
    tensors = load_file(str(next(tiny_assets.qwen2_tiny.glob("*.safetensors"))))
    assert shape.params == sum(t.numel() for t in tensors.values())


def test_static_memory_on_cuda_with_and_without_the_distributed_optimizer():
    n = SMALL.params
    x = ActorMemoryInputs(SMALL, seq_length=4, precision="bf16", data_parallel=8)
    assert static_bytes(x) == {
        "weights": 2 * n,
        "gradients": 4 * n,
        "main params (fp32)": 4 * n // 8,
        "optimizer state": 8 * n // 8,
        "reference model": 2 * n,
    }
    whole = static_bytes(
        ActorMemoryInputs(
            SMALL, 4, precision="fp16", data_parallel=8, distributed_optimizer=False, reference_model=False
        )
    )
    assert whole == {
        "weights": 2 * n,
        "gradients": 4 * n,
        "main params (fp32)": 4 * n,
        "optimizer state": 8 * n,
        "reference model": 0,
    }
    # the reference run: 3.09B params, fp16, DP 8, sharded: 5.75 + 11.50 + 1.44 + 2.87 + 5.75 GiB
    ref = static_bytes(ActorMemoryInputs(QWEN25_3B, 7096, precision="fp16", data_parallel=8))
    assert [round(v / GIB, 2) for v in ref.values()] == [5.75, 11.5, 1.44, 2.87, 5.75]


def test_static_memory_of_the_cpu_actor():
    n = SMALL.params
    x = ActorMemoryInputs(SMALL, 4, precision="fp32", device="cpu", data_parallel=2, reference_model=True)
    # fp32 master weights, fp32 gradients, Adam moments halved by ZeRO, fp32 reference
    assert static_bytes(x) == {
        "weights": 4 * n,
        "gradients": 4 * n,
        "main params (fp32)": 0,
        "optimizer state": 4 * n,
        "reference model": 4 * n,
    }
    sgd = static_bytes(ActorMemoryInputs(SMALL, 4, precision="fp32", device="cpu", optimizer="sgd"))
    assert sgd["optimizer state"] == 0


def test_activations_with_and_without_recompute():
    # per layer and token: 5h + (heads + 2 groups) d + 3 ffn = 40 + 16 + 48 = 104 elements
    x = ActorMemoryInputs(SMALL, seq_length=3, micro_batch_size=2, precision="bf16")  # 6 tokens, 2 bytes
    layer = 104 * 6 * 2
    assert activation_bytes(x) == {"activations (stored)": 2 * layer, "activations (backward)": layer}
    block = ActorMemoryInputs(
        SMALL, 3, 2, "bf16", recompute_granularity="full", recompute_method="block", recompute_num_layers=1
    )
    # layer 1 keeps its input (h per token), layer 2 everything; backward: the recomputed layer + one layer
    assert activation_bytes(block) == {"activations (stored)": 8 * 6 * 2 + layer, "activations (backward)": 2 * layer}
    uniform = ActorMemoryInputs(
        SMALL, 3, 2, "bf16", recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2
    )
    assert activation_bytes(uniform) == {"activations (stored)": 2 * 8 * 6 * 2, "activations (backward)": 3 * layer}


def test_local_spec_attention_is_quadratic_and_selective_recompute_drops_it():
    x = ActorMemoryInputs(SMALL, seq_length=3, micro_batch_size=1, precision="bf16", flash_attention=False)
    # probabilities: 2 heads * 3 * 3 * (4 fp32 + 2 bf16); keys/values expanded 1 -> 2 heads: 2 * 1 * 4 * 3 * 2 bytes;
    # backward: 2.5 fp32 probability-sized gradients; on CUDA Megatron's score buffer (2 * 9 elements, bf16)
    attention = 2 * 9 * 6 + 2 * 1 * 4 * 3 * 2
    layer = 104 * 3 * 2 + attention
    assert activation_bytes(x) == {
        "activations (stored)": 2 * layer,
        "activations (backward)": layer + int(2.5 * 2 * 9 * 4),
        "attention score buffer": 2 * 9 * 2,
    }
    selective = ActorMemoryInputs(SMALL, 3, 1, "bf16", flash_attention=False, recompute_granularity="selective")
    assert activation_bytes(selective)["activations (stored)"] == 2 * 104 * 3 * 2


def test_logprob_chunk_and_reserve():
    x = ActorMemoryInputs(SMALL, seq_length=50, micro_batch_size=1, precision="bf16", logprob_chunk_tokens=16)
    # 16 tokens x 10 vocab x (bf16 logits 2 + fp32 copy 4 + log-softmax 4 + its gradient 4 + fp32 gradient 4 + bf16 2)
    # + the decoder output 50 x 8 x 2
    assert logits_bytes(x) == 16 * 10 * 20 + 50 * 8 * 2
    assert (
        logits_bytes(ActorMemoryInputs(SMALL, 50, 1, "bf16", logprob_chunk_tokens=16, entropy=True))
        == 16 * 10 * 28 + 800
    )
    assert logits_bytes(ActorMemoryInputs(SMALL, 5, 1, "fp32", device="cpu")) == 5 * 10 * 16 + 5 * 8 * 4  # whole seq
    est = estimate_actor(x)
    body = sum(v for k, v in est.items.items() if not k.startswith("reserve"))
    assert est.items["reserve (context, fragmentation)"] == CUDA_RESERVE_BYTES + int(CUDA_FRAGMENTATION * body)
    assert "reserve (context, fragmentation)" not in estimate_actor(ActorMemoryInputs(SMALL, 5, device="cpu")).items


def test_largest_tensor_and_layer_size():
    # SMALL: embedding 10 x 8 = 80, fused gate/up 2 x 16 x 8 = 256, fused q/k/v (2 + 2) x 4 x 8 = 128
    assert SMALL.largest_tensor == 256 and SMALL.layer_params == 608
    # the embeddings: 151936 x 2048 (3B), 152064 x 3584 (7B); a 3B decoder layer has 77,076,992 parameters
    assert QWEN25_3B.largest_tensor == 311_164_928 and QWEN25_3B.layer_params == 77_076_992
    assert QWEN25_VL_7B_TEXT.largest_tensor == 544_997_376


def test_transfer_buffer_holds_the_largest_tensor():
    assert transfer_buffer_bytes(SMALL, 2, bucket_bytes=1000) == 1000
    assert transfer_buffer_bytes(SMALL, 2, bucket_bytes=100) == 512  # 256 elements x 2 bytes go alone
    assert BUCKET_BYTES == 1 << 30
    assert transfer_buffer_bytes(QWEN25_3B, 2) == BUCKET_BYTES  # embedding 622,329,856 bytes fits
    # Qwen2.5-VL-7B's bf16 embedding (and untied head): 1,089,994,752 bytes, over a 1 GiB buffer
    assert transfer_buffer_bytes(QWEN25_VL_7B_TEXT, 2) == 1_089_994_752 > BUCKET_BYTES


def test_vllm_engine_context_sleep_backups_and_update_copies():
    e = engine_memory(SMALL, gpu_bytes=10_000, fraction=0.5, dtype_bytes=2, bucket_bytes=1000)
    assert e.weights == 2768 and e.budget == 5000  # 1384 params in fp16
    assert e.outside == VLLM_CUDA_CONTEXT_BYTES == GIB // 2  # the CUDA context beside the fraction
    # level 2 backs up the runtime and CUDA-graph pools, level 1 the weights too
    assert e.host_asleep == VLLM_RUNTIME_BYTES
    level1 = engine_memory(SMALL, gpu_bytes=10_000, fraction=0.5, dtype_bytes=2, bucket_bytes=1000, sleep_level=1)
    assert level1.host_asleep == VLLM_RUNTIME_BYTES + 2768
    # one buffer of clones (1000) + 2 x the larger of a layer (608) and the largest tensor (256), fp16
    assert e.update_transient == 1000 + 2 * 608 * 2
    assert e.updating == VLLM_ASLEEP_RESIDENT_BYTES + 2768 + VLLM_RUNTIME_BYTES + 3432
    sglang = engine_memory(SMALL, gpu_bytes=10_000, fraction=0.5, dtype_bytes=2, backend="sglang")
    assert (sglang.outside, sglang.asleep, sglang.host_asleep, sglang.update_transient) == (
        ROLLOUT_WORKSPACE_BYTES,
        ROLLOUT_RESIDENT_BYTES,
        0,
        0,
    )
    assert sglang.updating == ROLLOUT_RESIDENT_BYTES + 2768


def test_sync_transfer_by_route_and_actor():
    # vLLM IPC: one buffer; Megatron's conversion: 2 x the largest tensor (256 elements, fp16)
    assert sync_transfer(SMALL, route="ipc", dtype_bytes=2, bucket_bytes=1000) == SyncTransfer(1000, 1024)
    # RLinf's paired route (SGLang): a bucket and the tensors packed into it
    assert sync_transfer(SMALL, route="paired", dtype_bytes=2, bucket_bytes=1000) == SyncTransfer(2000, 1024)
    # FSDP2: the largest parameter whole in fp32 and its fp16 cast: 256 x (4 + 2)
    assert sync_transfer(SMALL, route="ipc", dtype_bytes=2, fsdp=True, bucket_bytes=1000) == SyncTransfer(1000, 1536)
    # the reference 3B, fp16: 1 GiB + 2 x 622,329,856
    assert sync_transfer(QWEN25_3B, route="ipc", dtype_bytes=2).total == GIB + 1_244_659_712


def test_gpu_plan_phases_and_offload():
    x = ActorMemoryInputs(SMALL, 4, precision="bf16")
    gpu = 80 * GIB
    e = engine_memory(SMALL, gpu_bytes=gpu, fraction=0.75, dtype_bytes=2, bucket_bytes=1000)
    t = sync_transfer(SMALL, route="ipc", dtype_bytes=2, bucket_bytes=1000)
    plan = plan_gpu(
        x, engine=e, collocated=True, offload_weight=True, offload_optimizer=True, offload_grad=True, transfer=t
    )
    st = plan.actor.items
    assert plan.training_phase == plan.actor.peak + VLLM_ASLEEP_RESIDENT_BYTES
    assert plan.rollout_phase == int(0.75 * gpu) + VLLM_CUDA_CONTEXT_BYTES + CUDA_RESERVE_BYTES
    # the sync: the engine's weights and runtime awake (KV cache asleep) with its copies, the actor's context
    # and its transfer memory
    assert plan.sync_phase == VLLM_ASLEEP_RESIDENT_BYTES + 2768 + VLLM_RUNTIME_BYTES + 3432 + CUDA_RESERVE_BYTES + 2024
    assert plan.peak == plan.rollout_phase and plan.fits
    # host RAM: weights, reference, main parameters and Adam moments; the gradients are freed
    assert plan.actor_host == st["weights"] + st["reference model"] + st["main params (fp32)"] + st["optimizer state"]
    kept = plan_gpu(
        x, engine=e, collocated=True, offload_weight=False, offload_optimizer=True, offload_grad=False, transfer=t
    )
    assert kept.rollout_phase - plan.rollout_phase == st["weights"] + st["reference model"] + st["gradients"]
    assert kept.sync_phase - plan.sync_phase == st["weights"] + st["reference model"] + st["gradients"]
    assert kept.actor_host == st["main params (fp32)"] + st["optimizer state"]
    apart = plan_gpu(
        x, engine=e, collocated=False, offload_weight=True, offload_optimizer=True, offload_grad=True, transfer=t
    )
    assert apart.training_phase == apart.actor.peak and apart.fits
    assert (apart.sync_phase, apart.actor_host, apart.rollout_phase) == (0, 0, e.budget + VLLM_CUDA_CONTEXT_BYTES)


def test_fsdp2_sync_brings_the_weight_shards_back():
    x = ActorMemoryInputs(SMALL, seq_length=4, precision="bf16", data_parallel=4, fsdp=True)  # reference kept
    e = engine_memory(SMALL, gpu_bytes=80 * GIB, fraction=0.5, dtype_bytes=2, bucket_bytes=1000)
    t = sync_transfer(SMALL, route="ipc", dtype_bytes=2, fsdp=True, bucket_bytes=1000)
    off = plan_gpu(
        x, engine=e, collocated=True, offload_weight=True, offload_optimizer=True, offload_grad=True, transfer=t
    )
    # 1384 params over 4 ranks: fp32 weights 1384, bf16 reference 692, brought back for the gathers
    assert off.sync_onloaded == 1384 + 692
    assert off.sync_phase == e.updating + CUDA_RESERVE_BYTES + 1384 + 692 + 1000 + 1536
    on = plan_gpu(
        x, engine=e, collocated=True, offload_weight=False, offload_optimizer=True, offload_grad=True, transfer=t
    )
    assert on.sync_onloaded == 0 and on.sync_phase == off.sync_phase  # kept instead of brought back


def test_the_sync_phase_can_be_the_peak():
    """A GPU the training and rollout phases fit but not the sync: the engine's full weights (TP 1) beside the
    FSDP2 actor's shards and its transfer memory."""
    x = ActorMemoryInputs(SMALL, seq_length=4, precision="bf16", data_parallel=4, fsdp=True)
    e = engine_memory(SMALL, gpu_bytes=6 * GIB, fraction=0.5, dtype_bytes=2)
    plan = plan_gpu(
        x,
        engine=e,
        collocated=True,
        offload_weight=True,
        offload_optimizer=True,
        offload_grad=True,
        transfer=sync_transfer(SMALL, route="ipc", dtype_bytes=2, fsdp=True),
    )
    # asleep 1 + runtime 2 + buffer 1 (update copies) + buffer 1 (actor) + context 1 GiB, and a few KiB
    assert plan.sync_phase > 6 * GIB > plan.rollout_phase and plan.training_phase < 6 * GIB
    assert plan.peak == plan.sync_phase and not plan.fits


@pytest.mark.parametrize("seq, fits", [(4096, True), (7096, True)])
def test_the_reference_run_fits_an_h100_with_transformer_engine(seq, fits):
    x = ActorMemoryInputs(
        QWEN25_3B,
        seq,
        precision="fp16",
        data_parallel=8,
        recompute_granularity="full",
        recompute_method="block",
        recompute_num_layers=20,
    )
    plan = plan_gpu(
        x,
        engine=engine_memory(QWEN25_3B, gpu_bytes=80 * GIB, fraction=0.75, dtype_bytes=2),
        collocated=True,
        offload_weight=True,
        offload_optimizer=True,
        offload_grad=True,
        transfer=sync_transfer(QWEN25_3B, route="ipc", dtype_bytes=2),
    )
    assert plan.fits is fits


def test_fsdp2_shards_every_static_item_and_counts_the_full_logits():
    x = ActorMemoryInputs(
        SMALL, seq_length=4, micro_batch_size=2, precision="bf16", data_parallel=4, reference_model=True, fsdp=True
    )
    # 1384 params: fp32 weights, fp32 gradients, Adam's two fp32 moments, a bf16 reference, each over 4 ranks
    assert static_bytes(x) == {
        "weights": 1384,
        "gradients": 1384,
        "main params (fp32)": 0,
        "optimizer state": 2768,
        "reference model": 692,
    }
    # HF's forward returns all 2 x 4 positions' logits over 10 ids in bf16 on top of the chunked log-prob pass
    unsharded = ActorMemoryInputs(SMALL, seq_length=4, micro_batch_size=2, precision="bf16")
    assert logits_bytes(x) - logits_bytes(unsharded) == 2 * 4 * 10 * 2
