"""Typed schema of an rlinf_ext experiment (docs/contracts.md, "Config").

How an experiment config is built
---------------------------------
* **One YAML per experiment** in ``examples/searchr1/config/`` or ``examples/mmsearch/config/`` (a bare name is
  looked up there in that order: ``load_config("tiny-mm-cpu")`` finds ``examples/mmsearch/config/tiny-mm-cpu.yaml``
  from any working directory; a path to a ``.yaml`` file works too).
* **Composition.** A YAML may start with a Hydra-style ``defaults:`` list. Entries are merged in order, then
  the file itself (``_self_``, last unless placed elsewhere):

  - ``group/name`` or ``{group: name}`` -> ``configs/group/name.yaml`` (model presets ``configs/model/``,
    cluster profiles ``configs/cluster/``, shared settings ``configs/defaults/``, asset layouts ``configs/assets/``);
  - ``other.yaml`` / ``./other.yaml`` -> a file next to the current one (an eval YAML builds on its training YAML).

  Pieces may have their own ``defaults``. Mappings merge key by key and lists are replaced, except
  ``cluster.component_placement``, which a later layer replaces as a whole (so a profile's collocated placement
  does not leak into a disaggregated experiment).
* **Overrides.** ``key=value`` arguments (OmegaConf dotlist: values are YAML, so ``data.val_data_paths=[a,b]``,
  ``rollout.detokenize=false``, ``runner.resume_dir=null``) are applied after all files.
* **Required values and environment variables.** Nothing points to a made-up path. A value a user must supply
  is ``???`` or ``${oc.env:VAR}``; ``validate`` reports every one that is missing, naming the variable.
  Variables used by the shipped YAMLs:

  - ``RLINF_EXT_QWEN25_3B``: Hugging Face directory of Qwen2.5-3B-Instruct (reference run);
  - ``RLINF_EXT_SEARCHR1_DATA``: directory with ``train.jsonl`` and ``test/<bench>.jsonl`` (RLinf jsonl);
  - ``RLINF_EXT_RETRIEVER_ADDR``: ``host:port`` of the retrieval server of the reference run;
  - ``RLINF_EXT_EVAL_MODEL``: converted Hugging Face checkpoint evaluated by ``*-eval.yaml``;
  - ``RLINF_EXT_TINY_ASSETS``: the tiny offline assets (default ``<repo>/outputs/tiny_assets``,
    written by ``rlinf-ext make-tiny-assets --out outputs/tiny_assets``).

  ``${rlinf_ext.repo_root:}`` resolves to the repository root.
* **Validation** (``rlinf_ext.config.validate``) is strict and reports all problems at once: unknown keys
  (with the closest valid names), wrong types, missing required values, and cross-field rules (batch
  divisibility, placement vs. cluster, TP vs. attention heads, ...). Paths are checked for existence only with
  ``check_paths=True`` (the launcher does so when a run starts).

Every field below carries its help text in ``metadata["help"]``; ``REQUIRED`` (``???``) marks values without a
default. The schema holds only keys that something reads (``tests/config/test_keys_read.py`` checks it). Names
follow RLinf 0.3.0; RLinf's keys that rlinf_ext does not implement are in ``config/compat.py``: accepted at the
one value rlinf_ext behaves as, refused otherwise. The key reference in ``docs/contracts.md`` is generated from
this module (``python -m rlinf_ext.config.reference``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from rlinf_ext.protocol.agents import AGENTS, SEARCHR1
from rlinf_ext.protocol.engines import ENGINES, VLLM

REQUIRED = "???"  # OmegaConf's marker for a value that must be supplied


class ImportPath(str):
    """A ``pkg.module:attr`` string (a plug-in named by where it lives); config/structure.py type-checks it."""


AgentName = Union[Literal[tuple(AGENTS)], ImportPath]  # the registered agents, or an AgentSpec's import path
EngineName = Literal[tuple(ENGINES)]  # the registered engines: the structural check refuses any other name


def fld(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field with help text. ``path="file"|"dir"|"files"`` marks paths checked by check_paths;
    ``merge="replace"`` marks a mapping that a later layer replaces instead of merging into."""
    metadata = {"help": help, **meta}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    if isinstance(default, type):  # a nested section
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


# --------------------------------------------------------------------------------------------- cluster
@dataclass
class ClusterConfig:
    num_nodes: int = fld(1, "Number of nodes in the Ray cluster.")
    num_gpus_per_node: int = fld(
        8, "Accelerators per node. 0 = CPU-only cluster: placement ranks are then worker processes on node 0."
    )
    component_placement: dict[str, Any] = fld(
        {},
        "Component(s) -> resource ranks, RLinf syntax: {'actor,rollout,reward': 'all'} or {'actor': '0-3', "
        "'rollout': '4-7'}. Ranks are global GPU ranks (node n holds n*num_gpus_per_node ...). CPU cluster: "
        "worker processes on node 0, or NODES:PROCESSES ({'actor': '0:0', 'rollout,agentloop': '1:0'}), nodes "
        "numbered in the stable order (by IP, then Ray node id).",
        merge="replace",
    )
    node_groups: Optional[list[Any]] = fld(None, "Optional RLinf node groups (heterogeneous clusters).")
    ray_address: Optional[str] = fld(
        None,
        "Ray cluster to join (HEAD_IP:PORT); null = the RAY_ADDRESS environment variable, else one node: a "
        "private Ray instance for the run, several nodes: the cluster `ray start` joined on this node.",
    )
    join_timeout_s: float = fld(
        300.0,
        "Several nodes: how long the launcher waits for cluster.num_nodes nodes to join before it stops "
        "with the list of nodes it saw.",
    )
    gpu_memory_gib: float = fld(
        80.0,
        "Nominal memory of one GPU in GiB (H100 80GB: 80, H200: 141). `rlinf-ext plan` checks the per-GPU memory "
        "estimate against what such a GPU gives CUDA (read on this node's GPU of that kind, else the table of "
        "models/gpu_capacity.py: 80 -> 79.14) and `validate` refuses a config that does not fit.",
    )


# --------------------------------------------------------------------------------------------- runner
@dataclass
class LoggerConfig:
    log_path: str = fld("${runner.output_dir}/${runner.experiment_name}", "Directory for logs and tensorboard.")
    project_name: str = fld("rlinf_ext", "Project name (wandb/tensorboard).")
    experiment_name: str = fld("${runner.experiment_name}", "Run name shown by the loggers.")
    logger_backends: list[str] = fld(["tensorboard"], "Any of tensorboard, wandb, swanlab.")


@dataclass
class RunnerConfig:
    task_type: Literal["reasoning", "reasoning_eval"] = fld(
        "reasoning", "reasoning = RL training; reasoning_eval = evaluation only (no actor updates)."
    )
    experiment_name: str = fld(REQUIRED, "Name of the run; outputs go to output_dir/experiment_name.")
    output_dir: str = fld("${rlinf_ext.repo_root:}/outputs/runs", "Root directory of run outputs.")
    seed: int = fld(1234, "Global random seed.")
    logger: LoggerConfig = fld(LoggerConfig, "Metric logging.")
    max_epochs: int = fld(1, "Passes over the training data.")
    max_steps: int = fld(-1, "Stop after this many rollout steps (-1 = run max_epochs).")
    val_check_interval: int = fld(-1, "Validate every N steps (-1 = never during training).")
    save_interval: int = fld(-1, "Save a checkpoint every N steps (-1 = only at the end).")
    seq_length: int = fld(REQUIRED, "Maximum tokens of prompt + whole multi-turn response.")
    resume_dir: Optional[str] = fld(None, "null = fresh run, 'auto' = latest checkpoint of this run, or a PATH.")
    rollout_data_dir: Optional[str] = fld(None, "If set, trajectories of every step are dumped here as jsonl.")
    val_before_train: bool = fld(False, "Run validation once before the first training step.")
    val_samples_per_benchmark: int = fld(
        64,
        "Validation during training: questions per benchmark of data.val_data_paths, a fixed subset drawn "
        "with data.seed (-1 = all). Decoding is greedy.",
    )
    max_staleness: int = fld(
        0,
        "k: batches dispatched ahead of the step that trains them (batch b is rolled out during steps b-k..b, on "
        "weights up to k steps old, and trained at step b). 0 = the synchronous order. k > 0 needs "
        "rollout.return_logprobs=true and a disaggregated or CPU placement.",
    )
    partial_rollout: bool = fld(
        False,
        "A weight sync no longer waits for the turns in flight: they stop between decode steps and go on "
        "from their prompt and tokens so far on the new weights, so one turn may carry tokens of two versions, each "
        "trained with the log-probs of the weights that sampled it; no trained token may be older than "
        "runner.max_staleness. Needs runner.max_staleness >= 1 and an engine whose turns a sync can cut "
        "(EngineSpec.partial_rollout: hf between decode steps, vllm by its keep pause; SGLang not wired, refused).",
    )
    admission: Literal["batch", "group"] = fld(
        "batch",
        "What a step trains. batch: step b trains exactly batch b. group: step b trains the first "
        "data.rollout_batch_size prompt groups to complete among the batches in flight (whole groups, whichever batch "
        "they came from), waiting only for the groups whose head staleness would otherwise pass runner.max_staleness; "
        "batches are still dispatched k ahead, so at most k + 1 batches of prompts are untrained at once. k = 0 trains "
        "batch b at step b either way. Not with algorithm.adv_type=grpo_dynamic.",
    )
    in_flight_batches: int = fld(
        -1,
        "runner.admission=group: at most this many batches of prompt groups dispatched and untrained at once "
        "(-1 = k + 1, the most the staleness bound allows). At k + 1 every group is due at the step batch admission "
        "would train it, so after the first k steps the order is batch admission's; each batch less gives every "
        "group a step of slack to finish late in, for fewer rollouts overlapping the step. 1..k + 1.",
    )
    sync_every: int = fld(
        1,
        "Weight sync at every n-th step only (1 = every step). A skipped sync leaves the engines on older weights, "
        "so batch b is dispatched only once they hold version b - k or later: needs n - 1 <= runner.max_staleness and "
        "runner.admission=batch. Pays where a sync waits for whole turns (no partial rollout; "
        "benchmarks/async_sim.py).",
    )


# --------------------------------------------------------------------------------------------- algorithm
@dataclass
class SamplingParamsConfig:
    do_sample: bool = fld(True, "Sample (True) or greedy decode (False).")
    temperature: float = fld(1.0, "Sampling temperature.")
    top_p: float = fld(1.0, "Nucleus sampling threshold.")
    top_k: int = fld(-1, "Top-k sampling (-1 or a large number = off).")
    max_new_tokens: int = fld(500, "Tokens generated per turn at most.")
    stop: list[str] = fld([], "Stop strings; generation ends after the first one (needs rollout.detokenize).")
    repetition_penalty: float = fld(1.0, "Repetition penalty (1.0 = off).")


@dataclass
class OffPolicyConfig:
    behaviour_weight: Literal["truncate", "mask", "none"] = fld(
        "truncate",
        "Decoupled PPO: each loss token's clipped surrogate is weighted by w = pi_prox / pi_behav (the "
        "actor's recompute over the engine's sampled log-probs): 'truncate' caps w at behaviour_weight_cap, 'mask' "
        "zeroes it outside [behaviour_weight_floor, behaviour_weight_cap], 'none' keeps w = 1 (the plain clipped "
        "loss). Applies only when the engine's log-probs reach the actor (rollout.return_logprobs: true; "
        "runner.max_staleness > 0 requires them); without them the loss is the plain one and the "
        "actor/behaviour_* metrics are absent, except with runner.max_staleness > 0, where the step is refused, as is "
        "a step where some trajectories have them and others not. It applies at every k, 0 included: with engine "
        "log-probs on, 'truncate' reweights a synchronous step too (the engine-actor gap, TIS), so k = 0 trains the "
        "plain loss bit for bit only with rollout.return_logprobs: false or 'none'. runner.max_staleness > 0 with "
        "'none' trains stale tokens uncorrected (validate warns). A NaN or infinite engine log-prob on a sampled token "
        "is refused, naming the trajectory.",
    )
    behaviour_weight_cap: float = fld(
        2.0,
        "Upper bound C of the behaviour weight: truncation point ('truncate') or upper edge of the kept range "
        "('mask'); >= 1.",
    )
    behaviour_weight_floor: float = fld(
        0.5, "Lower edge of the kept range of the behaviour weight in 'mask' mode; in (0, 1]."
    )


@dataclass
class AlgorithmConfig:
    adv_type: Literal["grpo", "grpo_dynamic", "gae"] = fld(
        "grpo",
        "Advantage estimator: grpo (group-relative, no critic); grpo_dynamic: GRPO with dynamic sampling "
        "(DAPO): groups whose rewards are all equal are dropped and batches are refilled "
        "(algorithm.max_num_gen_batches; runner/dynamic_sampling.py); gae: PPO with a critic "
        "(critic.use_critic_model=true; GAE over the generated tokens, whitened over the batch, training/ppo_math.py).",
    )
    max_num_gen_batches: int = fld(
        1,
        "grpo_dynamic: batches a step may generate (the first and its refills from the run's data order) until "
        "data.rollout_batch_size groups with mixed rewards are kept. Short of them after N batches (or at the end of "
        "the data) the step trains the kept groups, completed with all-equal ones to a whole share of the actor's "
        "data-parallel ranks and minibatches (logged as dynamic/padded_groups). 1 = drop without refill.",
    )
    advantage_mode: Literal["trajectory"] = fld("trajectory", "One advantage per trajectory, broadcast to tokens.")
    group_size: int = fld(REQUIRED, "Responses sampled per prompt (GRPO group).")
    n_minibatches: int = fld(1, "Optimizer steps per rollout step (the rollout batch is split this many ways).")
    training_batch_size_per_gpu: int = fld(1, "Micro-batch size per data-parallel rank.")
    logprob_forward_micro_batch_size: int = fld(1, "Micro-batch size of the log-prob recomputation.")
    kl_beta: float = fld(0.0, "KL penalty weight against the reference policy (0 = off).")
    kl_penalty_type: Literal["low_var_kl", "kl", "abs", "mse"] = fld("low_var_kl", "KL estimator.")
    ratio_clip_eps: float = fld(0.2, "PPO ratio clip epsilon.")
    clip_ratio_c: Optional[float] = fld(None, "Dual-clip constant (null = off).")
    entropy_bonus: float = fld(0.0, "Entropy bonus weight.")
    loss_agg_func: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = fld(
        "token-mean", "How token losses are aggregated."
    )
    shuffle_rollout: bool = fld(False, "Shuffle trajectories before splitting into minibatches.")
    normalize_advantages: bool = fld(False, "Normalise advantages over the batch.")
    gamma: float = fld(1.0, "gae: discount per generated token (observation tokens cost no step); Search-R1: 1.0.")
    gae_lambda: float = fld(1.0, "gae: GAE's lambda; Search-R1: 1.0 (then A_t = reward - V_t).")
    value_clip: float = fld(
        0.5,
        "gae: the critic's new values are clipped to old value +- value_clip in the value loss (verl's "
        "cliprange_value, Search-R1: 0.5).",
    )
    sampling_params: SamplingParamsConfig = fld(SamplingParamsConfig, "Rollout sampling parameters.")
    off_policy: OffPolicyConfig = fld(
        OffPolicyConfig, "Off-policy correction with the engine's log-probs (decoupled PPO behaviour weight)."
    )


# --------------------------------------------------------------------------------------------- data
@dataclass
class DataConfig:
    train_data_paths: list[str] = fld(
        [], "Training files (RLinf jsonl or Search-R1 parquet); needed to train.", path="files"
    )
    val_data_paths: list[str] = fld([], "Validation/test files; evaluation reports one score per file.", path="files")
    max_prompt_length: int = fld(REQUIRED, "Prompts longer than this (tokens) are dropped.")
    rollout_batch_size: int = fld(REQUIRED, "Prompts per rollout step.")
    val_rollout_batch_size: Optional[int] = fld(None, "Prompts per validation batch (null = rollout_batch_size).")
    shuffle: bool = fld(
        True,
        "Shuffle training prompts: epoch e is a permutation seeded by data.seed + e, so a resume at "
        "any step trains what the uninterrupted run trains (runner/data_order.py).",
    )
    seed: int = fld(1234, "Seed of the data order.")
    data_size: int = fld(-1, "Use only the first N rows of each file (-1 = all).")
    prompt_key: str = fld("prompt", "Column holding the prompt.")
    answer_key: str = fld("solutions", "Column holding the gold answers.")
    apply_chat_template: bool = fld(False, "Apply the tokenizer chat template (False: prompts are pre-formatted).")


# --------------------------------------------------------------------------------------------- rollout
@dataclass
class RolloutModelConfig:
    model_path: str = fld(REQUIRED, "Hugging Face model directory served by the rollout engine.", path="dir")
    model_type: str = fld("qwen2.5", "RLinf model type (SupportedModel), e.g. qwen2.5.")
    precision: str = fld("${actor.model.precision}", "Rollout dtype (fp16, bf16, fp32).")


@dataclass
class SGLangConfig:
    attention_backend: str = fld("triton", "SGLang attention backend (triton, flashinfer).")
    decode_log_interval: int = fld(500000, "Decode steps between SGLang stat logs.")
    use_torch_compile: bool = fld(False, "torch.compile inside SGLang.")
    torch_compile_max_bs: int = fld(128, "Largest batch compiled by torch.compile.")


@dataclass
class VLLMConfig:
    attention_backend: str = fld("FLASH_ATTN", "vLLM attention backend.")
    enable_chunked_prefill: bool = fld(
        True,
        "vLLM chunked prefill (GPU engines; always off on CPU, where vLLM 0.32 fails on a seeded "
        "request prefilled in parts).",
    )
    enable_prefix_caching: bool = fld(True, "vLLM prefix caching.")
    max_num_batched_tokens: Optional[int] = fld(None, "vLLM token budget per batch (null = vLLM default).")
    kv_cache_memory_bytes: Optional[int] = fld(
        None,
        "KV cache bytes of one engine; null = 512 MiB on CPU (vLLM would otherwise reserve "
        "rollout.gpu_memory_utilization of the machine's RAM) and rollout.gpu_memory_utilization on GPUs.",
    )
    sleep_level: Literal[1, 2] = fld(
        2,
        "GPU, actor and rollout on the same GPUs: how the engine releases its GPU for training. 2 = weights and "
        "KV cache discarded (the next weight sync refills them); 1 = weights kept in host RAM (`rlinf-ext plan` "
        "counts it per node), KV cache discarded.",
    )


@dataclass
class HFRolloutConfig:
    dtype: Literal["float32", "bfloat16", "float16"] = fld("float32", "dtype of the CPU transformers engine.")
    max_batch_size: int = fld(8, "Sequences generated together by the transformers engine.")


@dataclass
class RolloutConfig:
    group_name: str = fld("RolloutGroup", "Ray worker group name.")
    rollout_backend: EngineName = fld(
        VLLM,
        "Generation engine, an entry of protocol/engines.py: vllm (CPU or GPU), hf (CPU transformers), sglang "
        "(GPU). Set here and by the experiment YAML only.",
    )
    model: RolloutModelConfig = fld(RolloutModelConfig, "Model served by the rollout engine.")
    tensor_parallel_size: int = fld(1, "Tensor parallel size of one rollout engine.")
    pipeline_parallel_size: int = fld(1, "Pipeline parallel size of one rollout engine.")
    detokenize: bool = fld(False, "Engine detokenizes while generating; required for stop strings.")
    gpu_memory_utilization: float = fld(
        0.65,
        "Fraction of each of its GPUs the engine takes: vLLM holds its weights, runtime and KV cache in it "
        "(`rlinf-ext plan` shows the split; validate refuses a fraction that cannot cache one runner.seq_length "
        "sequence).",
    )
    return_logprobs: bool = fld(
        False,
        "Engine returns the sampled tokens' log-probs; the loop keeps them on each turn and trajectory, and the "
        "actor weights its loss by them (algorithm.off_policy). The PPO ratio's anchor stays the actor's recomputed "
        "log-probs.",
    )
    enforce_eager: bool = fld(False, "Disable CUDA graphs.")
    distributed_executor_backend: str = fld("mp", "vLLM executor backend (mp, ray).")
    max_running_requests: int = fld(128, "Concurrent requests per engine.")
    cuda_graph_max_bs: int = fld(128, "Largest batch captured in a CUDA graph.")
    sglang: SGLangConfig = fld(SGLangConfig, "SGLang engine options.")
    vllm: VLLMConfig = fld(VLLMConfig, "vLLM engine options.")
    hf: HFRolloutConfig = fld(HFRolloutConfig, "CPU transformers engine options.")


# --------------------------------------------------------------------------------------------- actor
@dataclass
class ActorModelConfig:
    precision: Literal["fp16", "bf16", "fp32"] = fld("bf16", "Training dtype.")
    tensor_model_parallel_size: int = fld(1, "Megatron tensor parallel size (TP).")
    pipeline_model_parallel_size: int = fld(1, "Megatron pipeline parallel size (PP).")
    recompute_granularity: Optional[Literal["full", "selective"]] = fld(None, "Activation recomputation.")
    recompute_method: Optional[Literal["block", "uniform"]] = fld(None, "How layers are recomputed.")
    recompute_num_layers: Optional[int] = fld(None, "Layers recomputed with recompute_method.")
    # Megatron TransformerConfig switches (training/settings.py:TRANSFORMER_CONFIG_KEYS)
    apply_rope_fusion: bool = fld(False, "Fused RoPE kernel (needs Transformer Engine / apex).")
    bias_dropout_fusion: bool = fld(False, "Fused bias+dropout kernel.")
    bias_activation_fusion: bool = fld(False, "Fused bias+activation kernel.")
    persist_layer_norm: bool = fld(False, "Persistent layer-norm kernel.")
    attention_softmax_in_fp32: bool = fld(True, "Softmax in fp32 for stability.")
    gradient_accumulation_fusion: bool = fld(False, "Fused weight-gradient accumulation (needs apex).")
    use_cpu_initialization: bool = fld(False, "Initialise weights on CPU.")
    # Model dimensions: the actor reads the architecture from the checkpoint's config.json; presets set them so that
    # validate and `rlinf-ext plan` check TP and memory without the checkpoint (else they read its config.json).
    num_layers: Optional[int] = fld(None, "Transformer layers (preset or HF config.json).")
    hidden_size: Optional[int] = fld(None, "Hidden size (preset or HF config.json).")
    num_attention_heads: Optional[int] = fld(None, "Attention heads (preset or HF config.json).")
    num_query_groups: Optional[int] = fld(None, "KV groups (num_key_value_heads; preset or HF config.json).")
    ffn_hidden_size: Optional[int] = fld(None, "MLP intermediate size (preset or HF config.json).")
    padded_vocab_size: Optional[int] = fld(None, "Vocabulary size (preset or HF config.json).")
    share_embeddings_and_output_weights: Optional[bool] = fld(
        None, "Tied input embedding and output layer (preset or HF config.json tie_word_embeddings)."
    )


@dataclass
class MegatronConfig:
    distributed_timeout_minutes: int = fld(30, "torch.distributed timeout.")


@dataclass
class FSDPMixedPrecisionConfig:
    param_dtype: Literal["fp32", "bf16", "fp16"] = fld(
        "bf16", "fsdp (CUDA): parameter dtype in compute (the fp32 master copy stays sharded); CPU runs keep fp32."
    )
    reduce_dtype: Literal["fp32", "bf16", "fp16"] = fld("fp32", "fsdp (CUDA): gradient reduce-scatter dtype.")


@dataclass
class FSDPConfig:
    """The vision-language actor (actor.training_backend: fsdp): transformers' model sharded by torch FSDP2."""

    cpu_offload: bool = fld(False, "RLinf key; CPU offload of the FSDP2 actor is not implemented (must be false).")
    reshard_after_forward: bool = fld(True, "Free the gathered parameters after each forward (less memory).")
    mixed_precision: FSDPMixedPrecisionConfig = fld(FSDPMixedPrecisionConfig, "FSDP2 MixedPrecisionPolicy.")
    gradient_checkpointing: bool = fld(True, "Activation checkpointing of the HF model (recompute in backward).")
    freeze_vision_tower: bool = fld(False, "Do not train the vision tower (model.model.visual).")


@dataclass
class OptimConfig:
    optimizer: Literal["adam", "sgd"] = fld("adam", "Optimizer.")
    lr: float = fld(1.0e-6, "Peak learning rate.")
    weight_decay: float = fld(0.01, "Weight decay.")
    adam_beta1: float = fld(0.9, "Adam beta1.")
    adam_beta2: float = fld(0.95, "Adam beta2.")
    adam_eps: float = fld(1.0e-5, "Adam epsilon.")
    clip_grad: float = fld(1.0, "Gradient-norm clip.")
    use_distributed_optimizer: bool = fld(True, "Shard optimizer state over DP ranks.")
    loss_scale: Optional[float] = fld(None, "Static fp16 loss scale (null = dynamic).")


@dataclass
class LRSchedConfig:
    lr_warmup_fraction: float = fld(0.0, "Fraction of training spent warming up.")
    lr_decay_style: Literal["constant", "linear", "cosine"] = fld("constant", "Decay after warm-up.")
    min_lr: float = fld(0.0, "Floor of the learning rate.")


@dataclass
class ActorConfig:
    group_name: str = fld("ActorGroup", "Ray worker group name.")
    training_backend: Literal["megatron", "fsdp"] = fld(
        "megatron",
        "Training engine: megatron (text models, Megatron-core) or fsdp (qwen2.5_vl: transformers' "
        "model, FSDP2 when data-parallel).",
    )
    seed: int = fld(1234, "Actor random seed.")
    micro_batch_size: int = fld("${algorithm.training_batch_size_per_gpu}", "Derived: micro-batch per DP rank.")
    spec_name: Literal["decoder_gpt", "local_gpt"] = fld("decoder_gpt", "RLinf layer spec (decoder_gpt needs TE).")
    offload_optimizer: bool = fld(
        False, "Offload optimizer state while rolling out (collocated GPUs only; refused elsewhere)."
    )
    offload_weight: bool = fld(False, "Offload weights while rolling out (collocated GPUs only; refused elsewhere).")
    offload_grad: bool = fld(False, "Offload gradients while rolling out (collocated GPUs only; refused elsewhere).")
    logprob_chunk_tokens: int = fld(
        512,
        "Tokens per chunk of the log-prob computation: the fp32 [chunk, vocab] logits are the only "
        "full-vocabulary tensors the actor holds (lower = less memory, more kernel launches).",
    )
    model: ActorModelConfig = fld(ActorModelConfig, "Model parallelism and dimensions.")
    megatron: MegatronConfig = fld(MegatronConfig, "Megatron options.")
    fsdp_config: FSDPConfig = fld(FSDPConfig, "FSDP2 options (training_backend: fsdp).")
    optim: OptimConfig = fld(OptimConfig, "Optimizer.")
    lr_sched: LRSchedConfig = fld(LRSchedConfig, "Learning-rate schedule.")


# --------------------------------------------------------------------------------------------- critic
@dataclass
class CriticOptimConfig(OptimConfig):
    lr: float = fld(1.0e-5, "Peak learning rate of the critic (Search-R1's PPO: 1e-5).")


@dataclass
class CriticConfig:
    use_critic_model: bool = fld(
        False,
        "PPO's value model (algorithm.adv_type=gae): the policy's Megatron-core backbone with a scalar head, "
        "initialised from model_path, held and trained in the actor's processes (collocated with it, offloaded "
        "with it), checkpointed beside it. Text (megatron) actor only.",
    )
    model_path: str = fld(
        "${rollout.model.model_path}",
        "Hugging Face directory the critic's backbone starts from (the policy's by default).",
        path="dir",
    )
    micro_batch_size: int = fld("${actor.micro_batch_size}", "Micro-batch size of the critic's forward and update.")
    critic_warmup: int = fld(0, "The first N steps train the critic only (the policy is left unchanged).")
    offload: bool = fld(
        "${actor.offload_weight}",
        "Move the critic's weights, optimizer state and gradients off the "
        "GPU between phases (collocated GPUs only, as actor.offload_*).",
    )
    optim: CriticOptimConfig = fld(CriticOptimConfig, "The critic's optimizer (the LR schedule is the actor's).")


# --------------------------------------------------------------------------------------------- reward
@dataclass
class RewardConfig:
    group_name: str = fld("RewardGroup", "Ray worker group name.")
    reward_scale: float = fld(1.0, "Multiplier of the reward.")
    scoring: Literal["em", "subem", "f1", "format"] = fld(
        "em", "em, subem, f1, or the format-aware variant (mmsearch: em or subem)."
    )
    answer_tag_limit: int = fld(10, "More <answer> tags than this score 0.25 (reward hacking guard).")
    search_penalty: float = fld(
        0.0,
        "Correct answers that searched get (1 - penalty) (MMSearch-R1's idea; both agents' rewards apply it); 0 = off.",
    )
    shuffle_within_step: bool = fld(
        False,
        "A control run's switch: each step's rewards are permuted across all its trajectories before the "
        "advantage (same mean and spread, no link to what was done); the reward/* metrics stay the true ones.",
    )


# --------------------------------------------------------------------------------------------- agent loop
@dataclass
class AgentLoopConfig:
    group_name: str = fld("AgentLoopGroup", "Ray worker group name.")
    agent: AgentName = fld(
        SEARCHR1,
        "The agent (protocol/agents.py): searchr1 (<search>/<information>/<answer>), mmsearch (MMSearch-R1: "
        "image search <search><img></search>, <text_search>, <answer>; a Qwen2.5-VL model and FVQA data), or the "
        "import path of an AgentSpec (pkg.module:SPEC). Its own settings are the section agentloop.<its name>.",
    )
    response_length_total: int = fld(4096, "Token budget of the whole multi-turn response.")
    max_obs_length: int = fld(500, "Observation tokens kept per tool result (closing tag preserved).")
    print_outputs: bool = fld(False, "Print trajectories (debug).")


@dataclass
class ImageSearchToolConfig:
    backend: Literal["cache_dir", "cache_pickle", "dummy"] = fld(
        "cache_dir",
        "MMSearch-R1 image search: cache_dir (FVQA_Cache layout <cache_path>/<data_id>/meta.json + "
        "img_000.jpg ...), cache_pickle (the released *_image_search_results_cache.pkl, loaded without running "
        "code), dummy (canned results for tests).",
    )
    cache_path: Optional[str] = fld(None, "The cache directory (cache_dir) or .pkl file (cache_pickle).")
    val_cache_path: Optional[str] = fld(
        None,
        "Validation during training: the cache (same backend) holding the questions of data.val_data_paths, "
        "when cache_path holds only the training questions (null = cache_path).",
    )
    topk: int = fld(5, "Results (thumbnail + page title) shown per image search.")
    thumbnail_min_pixels: int = fld(3136, "Thumbnails are canonicalised to at least this many pixels (4 tokens).")
    thumbnail_max_pixels: int = fld(
        200704, "Thumbnails are canonicalised to at most this many pixels (256*28*28: <= 256 tokens each)."
    )
    on_missing_image: Literal["title_only", "placeholder", "error"] = fld(
        "title_only",
        "A result without a usable thumbnail: show its title only, a grey placeholder image, or fail the search.",
    )
    max_cache_bytes: int = fld(1 << 30, "cache_pickle: refuse pickles larger than this many bytes.")
    fail_on_miss: bool = fld(False, "Raise on a data_id without cached results (False: a failure observation).")


@dataclass
class ToolsConfig:
    """Each tool's own section, tools.<its name>, is its ``Tool.config_class``, mounted by ``config/agent_schema.py``
    for the built-in tools and the configured ones."""

    image_search: ImageSearchToolConfig = fld(ImageSearchToolConfig, "The image-search tool (MMSearch-R1).")


@dataclass
class RetrievalConfig:
    launch: bool = fld(False, "Start a local retrieval server for the run (otherwise tools.search.server_addr).")
    index_dir: Optional[str] = fld(None, "Directory of the built index (rlinf-ext build-index).", path="dir")
    corpus_path: Optional[str] = fld(None, "Search-R1 corpus jsonl.", path="file")
    pages_path: Optional[str] = fld(None, "ASearcher pages jsonl for /access (optional).", path="file")
    retriever: Literal["bm25", "e5", "bge"] = fld("bm25", "Retriever type.")
    model_path: Optional[str] = fld(None, "Encoder for dense retrieval.", path="dir")
    host: str = fld("127.0.0.1", "Bind address of a launched server.")
    per_node: bool = fld(
        False,
        "With launch: one server on every node of the cluster (bound to the node's IP, address files in "
        "RUN_DIR/retrievers/); each agent loop asks its own node's server first and fails over to the others.",
    )
    port: int = fld(0, "Port of a launched server (0 = a free port).")
    topk: int = fld(3, "Default top-k of the server.")
    max_batch_size: int = fld(64, "Queries batched together by the server.")
    max_wait_ms: float = fld(5.0, "Milliseconds the server waits to fill a batch.")


@dataclass
class PathsConfig:
    tiny_assets: Optional[str] = fld(
        None, "Root of the tiny offline assets (rlinf-ext make-tiny-assets); tiny YAMLs derive paths from it."
    )


# --------------------------------------------------------------------------------------------- root
@dataclass
class ExperimentConfig:
    cluster: ClusterConfig = fld(ClusterConfig, "Nodes, GPUs and component placement.")
    runner: RunnerConfig = fld(RunnerConfig, "Run control, logging, checkpointing.")
    algorithm: AlgorithmConfig = fld(AlgorithmConfig, "GRPO settings and sampling.")
    data: DataConfig = fld(DataConfig, "Datasets and batch size.")
    rollout: RolloutConfig = fld(RolloutConfig, "Generation engine.")
    actor: ActorConfig = fld(ActorConfig, "Policy training (Megatron).")
    critic: CriticConfig = fld(CriticConfig, "PPO's value model (algorithm.adv_type=gae).")
    reward: RewardConfig = fld(RewardConfig, "Reward function.")
    agentloop: AgentLoopConfig = fld(AgentLoopConfig, "Multi-turn search agent.")
    tools: ToolsConfig = fld(ToolsConfig, "Tools callable by the agent.")
    retrieval: RetrievalConfig = fld(RetrievalConfig, "Local retrieval server.")
    paths: PathsConfig = fld(PathsConfig, "External locations that other keys interpolate.")
