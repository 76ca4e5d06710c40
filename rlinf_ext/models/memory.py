"""Per-GPU memory of the Megatron-core actor (and the rollout engine beside it), by arithmetic from the model's
dimensions: what ``rlinf-ext plan`` prints and ``validate`` checks before any worker starts.

Pure arithmetic (no torch), all sizes in bytes. What is counted, for one data-parallel rank:

* static: parameters (16-bit on CUDA, Megatron's mixed precision; fp32 on CPU), the fp32 gradient buffer of
  Megatron's DDP, the fp32 main parameters (CUDA, 16-bit only) and Adam's two moments, both divided by the
  data-parallel size under the distributed optimizer (``training/optimizer.py``), and the frozen reference
  model in the compute dtype (when ``algorithm.kl_beta > 0``);
* activations of one micro-batch of ``runner.seq_length`` tokens kept for the backward: per layer and token
  ``5h + (heads + 2*groups)*d + 3*ffn`` elements (layer input, norm outputs, q/k/v, attention output,
  residual, MLP input/outputs), plus with Megatron's local layer spec the materialised attention
  probabilities (fp32 softmax output, and its 16-bit copy under 16-bit compute) and the expanded GQA keys and
  values; a layer under full recompute keeps only its input; the backward adds the recomputed unit and one
  layer of gradients;
* the chunked log-prob pass: ``chunk x vocab`` logits in the compute dtype, their fp32 copy, log-softmax and
  its gradient (``training/logprobs.py``), plus the decoder output;
* a reserve (CUDA context, allocator fragmentation) on CUDA.

The rollout engine (``EngineMemory``): vLLM takes ``rollout.gpu_memory_utilization`` of the GPU for weights,
its runtime (activations, CUDA graphs) and the KV cache (the rest), and its CUDA context beside that fraction;
asleep (collocated, ``sleep(level=1|2)``) its CuMem pools are off the GPU (the runtime and CUDA-graph pools
backed up to pinned host RAM at every level, the weights too at level 1; the KV cache discarded) and it keeps its
CUDA context and communicators. SGLang takes its fraction plus workspace and keeps more when released. A
vision-language model's vision tower (``vision_tower_params``) counts in the actor's state and in the engine's
weights.

A collocated GPU goes through three phases (``GpuPlan``): training (the actor's peak beside the sleeping
engine), the weight sync (the engine awake with its weights and runtime pools but its KV cache still asleep,
taking the new weights chunk by chunk, beside what the actor keeps plus its transfer memory: ``SyncTransfer``)
and the rollout (the engine's fraction and context beside what the offloaded actor keeps). The KV cache is
woken only once the actor has freed its transfer memory. Apart (disaggregated), an FSDP2 actor's rank 0 gathers the
full state in its host RAM for each sync (``rank0_gather_bytes``). The GPU's size is what it gives CUDA, not its
nominal size (``models/gpu_capacity.py``).

Calibration against measured peaks: ``benchmarks/actor_memory_calibration.py`` (CPU) and ``scripts/gpu_smoke.py``
stage S5: on one H100 (2026-11-26, Qwen2.5-3B shape, fp16, reference model, full recompute, local spec)
measured/estimated peak without the reserve 0.92, 1.00, 1.00 at 1k/1.5k/2k tokens, so the CUDA terms stand as they
are (docs/results.md 17); the engine and sync figures are read from vLLM 0.32's and SGLang 0.5.23's sources, not
measured.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 2**30
# CUDA: context + cuBLAS workspace outside torch's allocator, and fragmentation of its cached blocks. It is also
# what the offloaded actor process keeps on a collocated GPU (its own CUDA context) while the engine runs.
CUDA_RESERVE_BYTES = int(1.0 * GIB)
CUDA_FRAGMENTATION = 0.05
# a released SGLang engine still holds its CUDA context and graph pool (1.5-3 GB)
ROLLOUT_RESIDENT_BYTES = int(2.5 * GIB)
# SGLang's activations and CUDA graphs outside its static fraction while it generates
ROLLOUT_WORKSPACE_BYTES = int(2.0 * GIB)
# a sleeping vLLM engine: CUDA context, NCCL communicators and allocations outside its CuMem pool (its weights,
# KV cache, runtime and CUDA-graph pools leave the GPU: vllm/device_allocator/sleep_mode_backend.py)
VLLM_ASLEEP_RESIDENT_BYTES = int(1.0 * GIB)
# inside vLLM's fraction besides weights and KV cache: the profiled forward's activations, CUDA graphs, sampler;
# also the bound on the runtime and CUDA-graph pools a sleeping engine backs up to host RAM
VLLM_RUNTIME_BYTES = int(2.0 * GIB)
# each vLLM worker's CUDA context (and its NCCL buffers under TP), made before the worker's memory snapshot
# (vllm/v1/worker/gpu_worker.py:505-537), so outside the budget ``gpu_memory_utilization x total`` that
# request_memory takes from that snapshot (vllm/v1/worker/utils.py:724-726; KV cache = budget - profiled
# non-KV memory, gpu_worker.py:740-744)
VLLM_CUDA_CONTEXT_BYTES = int(0.5 * GIB)
# the weight sync's transfer buffer: weights cross from the actor to the engine in buckets of this many bytes
# (every route of sync/; vLLM gets it as packed_buffer_size_bytes, raised to the largest tensor): bounded extra
# memory on both sides, and the plan counts exactly this
BUCKET_BYTES = 1 << 30


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden: int
    ffn: int
    heads: int
    groups: int
    head_dim: int
    vocab: int
    tied: bool

    @property
    def params(self) -> int:
        """Parameter count of a Qwen2 decoder (q/k/v biases, no other linear bias, RMSNorm)."""
        h = self.hidden
        return self.vocab * h * (1 if self.tied else 2) + self.num_layers * self.layer_params + h

    @property
    def all_params(self) -> int:
        """Language model + vision tower."""
        return self.params + self.vision_params

    @property
    def largest_tensor(self) -> int:
        """Elements of the largest weight a conversion handles: the embedding (or output layer), Megatron's fused
        gate/up projection or the fused q/k/v projection (the vision tower's are smaller)."""
        h = self.hidden
        return max(self.vocab * h, 2 * self.ffn * h, (self.heads + 2 * self.groups) * self.head_dim * h)

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (see ``params``)."""
        h, qkv = self.hidden, (self.heads + 2 * self.groups) * self.head_dim
        return h * qkv + qkv + self.heads * self.head_dim * h + 3 * h * self.ffn + 2 * h

    def kv_bytes_per_token(self, dtype_bytes: int, tensor_parallel: int = 1) -> int:
        """KV cache bytes of one token on one GPU of an engine (keys and values of every layer; KV heads split
        over TP, replicated when there are fewer heads than GPUs)."""
        heads = max(self.groups // max(tensor_parallel, 1), 1)
        return 2 * self.num_layers * heads * self.head_dim * dtype_bytes

    vision_params: int = 0  # a vision-language model's vision tower (``vision_tower_params``)


def vision_tower_params(
    depth: int = 32,
    hidden: int = 1280,
    ffn: int = 3420,
    out_hidden: int = 3584,
    patch: int = 14,
    temporal_patch: int = 2,
    in_channels: int = 3,
    spatial_merge: int = 2,
) -> int:
    """Parameters of Qwen2.5-VL's vision tower (transformers' ``Qwen2_5_VisionTransformerPretrainedModel``):
    the patch embedding (a bias-free 3D convolution), ``depth`` blocks (two RMSNorms, qkv and output projections
    with biases, a gated MLP with biases) and the merger (RMSNorm, then an MLP from ``spatial_merge**2`` patches
    to the language model's hidden size). The defaults are the tower every Qwen2.5-VL size shares (3B: out 2048,
    7B: 3584)."""
    patch_embed = in_channels * temporal_patch * patch * patch * hidden
    block = (
        2 * hidden
        + (3 * hidden * hidden + 3 * hidden)
        + (hidden * hidden + hidden)
        + 3 * hidden * ffn
        + 2 * ffn
        + hidden
    )
    merged = hidden * spatial_merge * spatial_merge
    merger = hidden + merged * merged + merged + merged * out_hidden + out_hidden
    return patch_embed + depth * block + merger


@dataclass(frozen=True)
class ActorMemoryInputs:
    shape: ModelShape
    seq_length: int
    micro_batch_size: int = 1
    precision: str = "bf16"  # fp32 | bf16 | fp16
    device: str = "cuda"  # cuda: Megatron's mixed precision and optimizer; cpu: fp32 master weights, torch
    data_parallel: int = 1
    distributed_optimizer: bool = True
    optimizer: str = "adam"
    reference_model: bool = True
    flash_attention: bool = True  # Transformer Engine spec (decoder_gpt); False = local spec
    recompute_granularity: str | None = None  # None | full | selective
    recompute_method: str | None = None  # block | uniform
    recompute_num_layers: int | None = None
    logprob_chunk_tokens: int = 512
    entropy: bool = False
    # the HF vision-language actor under FSDP2: parameters, gradients, Adam state and the reference sharded over
    # the data-parallel ranks (fp32 shards; the vision tower's included), full logits of a micro-batch (HF
    # computes them all); the vision tower's activations are not counted
    fsdp: bool = False
    # PPO's critic (training/critic.py): a second copy of the model with its own gradients and optimizer, in the
    # actor's processes; offloaded (weights and optimizer to host RAM, gradients freed) while the engine runs
    critic: bool = False

    @property
    def compute_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per item (``items``: name -> bytes, in print order) and the peak of a training step."""

    items: dict[str, int]

    @property
    def static(self) -> int:
        return sum(v for k, v in self.items.items() if k in STATIC_ITEMS)

    @property
    def peak(self) -> int:
        return sum(self.items.values())


CRITIC_STATE = "critic weights + optimizer"
CRITIC_GRADS = "critic gradients"
STATIC_ITEMS = (
    "weights",
    "gradients",
    "main params (fp32)",
    "optimizer state",
    "reference model",
    CRITIC_STATE,
    CRITIC_GRADS,
)


def critic_bytes(x: ActorMemoryInputs) -> dict[str, int]:
    """PPO's critic: the policy's static items without the reference (its frozen vocabulary projection counted as
    trained: an upper bound for untied models, exact for tied ones; the scalar head is negligible)."""
    if not x.critic:
        return {}
    st = static_bytes(replace(x, critic=False, reference_model=False))
    return {
        CRITIC_STATE: st["weights"] + st["main params (fp32)"] + st["optimizer state"],
        CRITIC_GRADS: st["gradients"],
    }


def static_bytes(x: ActorMemoryInputs) -> dict[str, int]:
    n = x.shape.all_params
    if x.fsdp:
        dp = max(x.data_parallel, 1)
        moments = 8 if x.optimizer == "adam" else 0
        return {
            "weights": n * 4 // dp,
            "gradients": n * 4 // dp,
            "main params (fp32)": 0,
            "optimizer state": n * moments // dp,
            "reference model": n * x.compute_bytes // dp if x.reference_model else 0,
        }
    shard = x.data_parallel if x.distributed_optimizer else 1
    cuda_mixed = x.device == "cuda" and x.precision != "fp32"
    moments = 8 if x.optimizer == "adam" else 0  # SGD runs without momentum
    return {
        "weights": n * (2 if cuda_mixed else 4),
        "gradients": n * 4,  # DDP's fp32 buffer
        "main params (fp32)": (n * 4) // shard if cuda_mixed else 0,
        "optimizer state": (n * moments) // shard,
        "reference model": n * x.compute_bytes if x.reference_model else 0,
    }


def layer_elements_per_token(shape: ModelShape) -> int:
    """Activation elements one transformer layer keeps per token for its backward (flash attention)."""
    h = shape.hidden
    return 5 * h + (shape.heads + 2 * shape.groups) * shape.head_dim + 3 * shape.ffn


def _score_elements(x: ActorMemoryInputs) -> int:
    """Elements of one layer's ``[b, heads, T, T]`` attention scores."""
    return x.shape.heads * x.micro_batch_size * x.seq_length**2


def attention_bytes_per_layer(x: ActorMemoryInputs) -> int:
    """Local spec only: the ``[heads, T, T]`` probabilities (fp32 softmax output, + its 16-bit copy) and the
    keys/values expanded from ``groups`` to ``heads`` (``dot_product_attention.py``)."""
    if x.flash_attention:
        return 0
    s = x.shape
    tokens = x.micro_batch_size * x.seq_length
    probs = _score_elements(x) * (4 + (2 if x.compute_bytes == 2 else 0))
    expanded_kv = 2 * (s.heads - s.groups) * s.head_dim * tokens * x.compute_bytes
    return probs + expanded_kv


def attention_backward_bytes(x: ActorMemoryInputs) -> int:
    """Local spec: the softmax backward holds the gradients of the probabilities and of the scores (fp32) at
    once, with a masked copy in between: 2.5 fp32 score-sized tensors (measured on CPU, see the calibration)."""
    if x.flash_attention or x.recompute_granularity == "selective":
        return 0
    return int(2.5 * _score_elements(x) * 4)


def activation_bytes(x: ActorMemoryInputs) -> dict[str, int]:
    s = x.shape
    tokens = x.micro_batch_size * x.seq_length
    attention = attention_bytes_per_layer(x)
    if x.recompute_granularity == "selective":
        attention = 0  # core attention recomputed (Megatron's default recompute_modules)
    full_layer = layer_elements_per_token(s) * tokens * x.compute_bytes + attention
    layer_input = s.hidden * tokens * x.compute_bytes
    recomputed, unit = 0, 1
    if x.recompute_granularity == "full":
        n = min(max(int(x.recompute_num_layers or 1), 1), s.num_layers)
        if x.recompute_method == "uniform":
            recomputed, unit = s.num_layers, n  # every layer, in units of n layers
        else:  # block: the first n layers
            recomputed, unit = n, 1
    stored = (s.num_layers - recomputed) * full_layer + recomputed * layer_input
    # the recomputed unit, one layer of activation gradients, the attention softmax backward
    backward = (unit if recomputed else 0) * full_layer + full_layer + attention_backward_bytes(x)
    items = {"activations (stored)": stored, "activations (backward)": backward}
    if x.device == "cuda" and not x.flash_attention:
        # Megatron's global buffer for the raw scores (dot_product_attention.py), kept between calls; on CPU
        # its pages are never written (baddbmm with beta=0) and so never resident
        items["attention score buffer"] = _score_elements(x) * x.compute_bytes
    return items


def logits_bytes(x: ActorMemoryInputs) -> int:
    """One log-prob chunk in the backward: logits (compute dtype), fp32 copy (16-bit only), log-softmax and its
    gradient, the gradient of the logits (fp32, + compute dtype); entropy adds exp and the product."""
    tokens = min(x.logprob_chunk_tokens, x.micro_batch_size * x.seq_length)
    per_element = 4 * 3 + x.compute_bytes + (4 + x.compute_bytes if x.compute_bytes == 2 else 0)
    if x.entropy:
        per_element += 8
    decoder_output = x.micro_batch_size * x.seq_length * x.shape.hidden * x.compute_bytes
    if x.fsdp:  # HF's forward returns every position's logits in the compute dtype
        decoder_output += x.micro_batch_size * x.seq_length * x.shape.vocab * x.compute_bytes
    return tokens * x.shape.vocab * per_element + decoder_output


def estimate_actor(x: ActorMemoryInputs) -> MemoryEstimate:
    # the critic's activations are the policy's less the vocabulary (it trains before the policy, not with it)
    items = {**static_bytes(x), **critic_bytes(x), **activation_bytes(x), "log-prob chunk": logits_bytes(x)}
    if x.device == "cuda":
        items["reserve (context, fragmentation)"] = CUDA_RESERVE_BYTES + int(CUDA_FRAGMENTATION * sum(items.values()))
    return MemoryEstimate(items)


@dataclass(frozen=True)
class EngineMemory:
    """One rollout engine's GPU, vLLM's way: ``fraction`` of the GPU holds the weights (this GPU's share under TP),
    the runtime and the KV cache, which gets the rest. ``outside`` is what the engine takes beyond its fraction
    while it generates (vLLM: each worker's CUDA context; SGLang: its workspace), ``asleep`` what it keeps on the
    GPU while released, ``update_transient`` what taking new weights adds on its GPU, and ``host_asleep`` the
    host RAM its sleep takes."""

    gpu_bytes: int
    fraction: float
    weights: int
    runtime: int
    kv_per_token: int
    outside: int = 0
    asleep: int = 0
    host_asleep: int = 0
    update_transient: int = 0

    @property
    def budget(self) -> int:
        return int(self.fraction * self.gpu_bytes)

    @property
    def kv_cache(self) -> int:
        return self.budget - self.weights - self.runtime

    @property
    def kv_tokens(self) -> int:
        return max(self.kv_cache, 0) // max(self.kv_per_token, 1)

    @property
    def updating(self) -> int:
        """On the GPU during a collocated weight sync: what it keeps asleep, the weights and runtime pools woken
        for the update (the KV cache still asleep), and the update's own copies."""
        return self.asleep + self.weights + self.runtime + self.update_transient

    def min_fraction(self, tokens: int) -> float:
        """The smallest fraction whose KV cache holds ``tokens`` tokens (rounded up to 0.01)."""
        need = self.weights + self.runtime + tokens * self.kv_per_token
        return -(-100 * need // self.gpu_bytes) / 100


def transfer_buffer_bytes(shape: ModelShape, dtype_bytes: int, bucket_bytes: int = BUCKET_BYTES) -> int:
    """One packed transfer buffer: ``bucket_bytes``, or the largest tensor when that is bigger (RLinf's route
    packs it alone; vLLM's packed IPC producer refuses a tensor over its capacity,
    vllm/distributed/weight_transfer/packed_tensor.py:356-361, so its buffer must hold it)."""
    return max(bucket_bytes, shape.largest_tensor * dtype_bytes)


def engine_memory(
    shape: ModelShape,
    *,
    gpu_bytes: int,
    fraction: float,
    dtype_bytes: int,
    tensor_parallel: int = 1,
    backend: str = "vllm",
    sleep_level: int = 2,
    bucket_bytes: int = BUCKET_BYTES,
) -> EngineMemory:
    """The engine of ``shape`` (vision tower included) on one of its GPUs.

    vLLM: its CUDA context is outside its fraction (``VLLM_CUDA_CONTEXT_BYTES``). Asleep, ``CuMemBackend.suspend``
    backs up the ``runtime`` and ``cudagraph`` pools to pinned host RAM at every level and the ``weights`` pool
    too at level 1 (vllm/device_allocator/sleep_mode_backend.py:127-137, the copy in cumem.py:265-276); the runtime
    figure bounds the first two. Taking new weights, its consumer clones each chunk of the packed buffer
    (packed_tensor.py:491-494) and the layerwise reload buffers those clones until a layer is complete, then
    materialises the layer before copying it into the original storage
    (vllm/model_executor/model_loader/reload/layerwise.py, ``_layerwise_process``): one buffer of clones plus two of the largest layer or tensor (a finished layer being
    materialised and an unfinished one's clones from the chunk before), counted whole under TP.

    SGLang: its fraction plus workspace, and ``ROLLOUT_RESIDENT_BYTES`` released; its memory saver keeps no copy
    in host RAM; an update loads straight from the actor's tensors it maps (``tensor.to(device)`` on the same
    device copies nothing, sglang/srt/model_executor/model_runner_components/weight_updater.py:444-447)."""
    tp = max(tensor_parallel, 1)
    weights = shape.all_params * dtype_bytes // tp
    kv = shape.kv_bytes_per_token(dtype_bytes, tp)
    if backend == "sglang":
        return EngineMemory(
            gpu_bytes, fraction, weights, 0, kv, outside=ROLLOUT_WORKSPACE_BYTES, asleep=ROLLOUT_RESIDENT_BYTES
        )
    largest_unit = max(shape.largest_tensor, shape.layer_params) * dtype_bytes
    return EngineMemory(
        gpu_bytes,
        fraction,
        weights,
        VLLM_RUNTIME_BYTES,
        kv,
        outside=VLLM_CUDA_CONTEXT_BYTES,
        asleep=VLLM_ASLEEP_RESIDENT_BYTES,
        host_asleep=VLLM_RUNTIME_BYTES + (weights if sleep_level == 1 else 0),
        update_transient=transfer_buffer_bytes(shape, dtype_bytes, bucket_bytes) + 2 * largest_unit,
    )


@dataclass(frozen=True)
class SyncTransfer:
    """What the actor adds on a collocated GPU while it sends its weights: ``buffers`` (the packed transfer
    buffers alive at once) and ``conversion`` (the conversion's transient tensors)."""

    buffers: int
    conversion: int

    @property
    def total(self) -> int:
        return self.buffers + self.conversion


def sync_transfer(
    shape: ModelShape, *, route: str, dtype_bytes: int, fsdp: bool = False, bucket_bytes: int = BUCKET_BYTES
) -> SyncTransfer:
    """The actor's transfer memory on its GPU for one collocated sync, in the rollout's dtype (``dtype_bytes``).

    ``route``: ``ipc`` (vLLM's packed IPC producer: one buffer per transfer, packed_tensor.py:342, allocated inside
    the producer and freed after the last chunk, so it does not persist across syncs; the actor's
    ``ipc_collect``/``empty_cache`` after the sync give it back) or ``paired`` (RLinf's route for SGLang: the
    tensors of one bucket are held while they are packed into its buffer, sync/weight_sync.py:pack_buckets, so
    two buffers' worth). The conversion: Megatron brings each offloaded weight over as a cast copy and splits or
    slices it (2 x the largest tensor); FSDP2 gathers each parameter whole in fp32 (``full_tensor``) and casts it
    (4 + ``dtype_bytes`` bytes per element of the largest)."""
    buffer = transfer_buffer_bytes(shape, dtype_bytes, bucket_bytes)
    buffers = buffer if route == "ipc" else 2 * buffer
    conversion = shape.largest_tensor * (4 + dtype_bytes) if fsdp else 2 * shape.largest_tensor * dtype_bytes
    return SyncTransfer(buffers, conversion)


def rank0_gather_bytes(shape: ModelShape, dtype_bytes: int) -> int:
    """Host RAM of FSDP2's rank 0 when it sends the weights alone (disaggregated: vLLM's NCCL route, SGLang's
    group): ``FSDPPolicy.hf_state_dict`` gathers the full state there in fp32 (torch's ``full_state_dict`` with
    ``cpu_offload``, rank 0 only) and casts it to the rollout's dtype while the fp32 dict is still referenced, so both
    are alive at once (no copy when the rollout is fp32). A checkpoint's gather is the fp32 part alone."""
    n = shape.all_params
    return n * 4 + (n * dtype_bytes if dtype_bytes != 4 else 0)


@dataclass(frozen=True)
class GpuPlan:
    """Per-GPU peak by phase, collocated: training (actor peak + the released engine), the weight sync (the engine
    awake without its KV cache + what the actor keeps + its transfer memory + what it brings back for the sync)
    and rollout (engine + what the actor keeps). Apart (disaggregated), the training phase is the actor's GPUs
    and the rollout phase the engine's; the sync phase is not planned."""

    actor: MemoryEstimate
    engine: EngineMemory
    collocated: bool
    actor_kept: int  # on the GPU while the engine runs: the actor's CUDA context + the parts it does not offload
    actor_host: int = 0  # host RAM of the offloaded parts (gradients are freed, not moved)
    transfer: SyncTransfer | None = None
    sync_onloaded: int = 0  # FSDP2: the offloaded weight shards brought back for the gathers
    rank0_host: int = 0  # host RAM of the actor's rank 0 during a sync it sends alone (``rank0_gather_bytes``)

    @property
    def gpu_bytes(self) -> int:
        return self.engine.gpu_bytes

    @property
    def training_phase(self) -> int:
        return self.actor.peak + (self.engine.asleep if self.collocated else 0)

    @property
    def sync_actor(self) -> int:
        return self.actor_kept + self.sync_onloaded + (self.transfer.total if self.transfer else 0)

    @property
    def sync_phase(self) -> int:
        return self.engine.updating + self.sync_actor if self.collocated and self.transfer else 0

    @property
    def rollout_phase(self) -> int:
        engine = self.engine.budget + self.engine.outside
        return engine + (self.actor_kept if self.collocated else 0)

    @property
    def peak(self) -> int:
        return max(self.training_phase, self.sync_phase, self.rollout_phase)

    @property
    def fits(self) -> bool:
        return self.peak <= self.gpu_bytes


def plan_gpu(
    x: ActorMemoryInputs,
    *,
    engine: EngineMemory,
    collocated: bool,
    offload_weight: bool,
    offload_optimizer: bool,
    offload_grad: bool,
    transfer: SyncTransfer | None = None,
    rank0_host: int = 0,
) -> GpuPlan:
    """The actor on a GPU it shares with ``engine`` (collocated) or owns; offloaded parts leave the GPU for host
    RAM while the engine runs (gradients are freed), and an FSDP2 actor brings its weight shards back for the
    gathers of a sync. ``transfer``: the collocated sync's transfer memory (None: no sync phase planned);
    ``rank0_host``: what a sync that rank 0 sends alone gathers in its host RAM."""
    actor = estimate_actor(x)
    st = actor.items
    parts = {
        "weights": ("weights", "reference model"),
        "optimizer": ("main params (fp32)", "optimizer state"),
        "grads": ("gradients",),
    }
    offloaded = {"weights": offload_weight, "optimizer": offload_optimizer, "grads": offload_grad}
    kept = CUDA_RESERVE_BYTES + sum(st[k] for part, keys in parts.items() if not offloaded[part] for k in keys)
    host = sum(st[k] for part, keys in parts.items() if offloaded[part] and part != "grads" for k in keys)
    host += st.get(CRITIC_STATE, 0)  # the critic offloads whole when collocated (config/rules/critic.py)
    onloaded = st["weights"] + st["reference model"] if x.fsdp and offload_weight else 0
    if not collocated:
        host = 0  # the actor offloads only to give a shared GPU to the engine
    return GpuPlan(actor, engine, collocated, kept, host, transfer if collocated else None, onloaded, rank0_host)
