"""RLinf's config keys that rlinf_ext does not implement: one table, consulted by the structural check.

An RLinf-format YAML may carry these keys. At the one value each accepts (RLinf's "off", or what rlinf_ext does
anyway) the key is accepted and dropped: it never reaches the typed config. Any other value is refused with the
reason and the fix (``config/structure.py:check_structure``). ``to_dictconfig`` adds them back at their accepted
values, so the DictConfig handed to RLinf's Cluster and placement has RLinf's shape.

An accepted value is either a constant or ``Follows``: a function of other keys (the actor's collective backend
follows the cluster, ``rollout.is_eval`` follows ``runner.task_type``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Follows:
    """An accepted value computed from other keys' values."""

    sources: tuple[str, ...]  # dotted keys whose values ``value`` takes, in order
    value: Callable[..., Any]
    describe: str  # the accepted value in words (docs, messages)


@dataclass(frozen=True)
class CompatKey:
    key: str  # dotted RLinf name
    accepted: Any  # the one value accepted: a constant or Follows
    why: str  # what rlinf_ext does instead
    fix: str = ""  # empty: "remove it"

    def accepted_text(self) -> str:
        return self.accepted.describe if isinstance(self.accepted, Follows) else _yaml(self.accepted)

    def fix_text(self) -> str:
        return self.fix or f"remove it (rlinf_ext behaves as {self.key}={self.accepted_text()})."


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_ARCH_WHY = (
    "the actor builds the Qwen2 architecture from the checkpoint's config.json (SwiGLU, RMSNorm, RoPE, "
    "biases on q/k/v only); RLinf's switch for other models has no effect here."
)
_NOT_WRITTEN = "the actor converts the HF checkpoint in memory; nothing is written."


def _same(a: Any) -> Any:
    return a


COMPAT: tuple[CompatKey, ...] = (
    # ---- algorithm
    CompatKey(
        "algorithm.recompute_logprobs",
        True,
        "the trainer always recomputes the old log-probs with the actor: every agent re-tokenises tool text, "
        "so the engine's log-probs do not cover the trained tokens.",
        "set algorithm.recompute_logprobs=true (or remove it).",
    ),
    CompatKey("algorithm.loss_type", "actor", "the policy loss is GRPO's clipped surrogate (RLinf's 'actor' loss)."),
    CompatKey("algorithm.sampling_params.min_new_tokens", 1, "the rollout engines enforce no minimum turn length."),
    CompatKey(
        "algorithm.clip_ratio_low",
        None,
        "the policy loss clips symmetrically.",
        "set algorithm.ratio_clip_eps instead.",
    ),
    CompatKey(
        "algorithm.clip_ratio_high",
        None,
        "the policy loss clips symmetrically.",
        "set algorithm.ratio_clip_eps instead.",
    ),
    CompatKey("algorithm.early_stop_imp_ratio", None, "the actor never skips an update on the importance ratio."),
    CompatKey(
        "algorithm.use_valid_token_scale",
        False,
        "the loss is aggregated as algorithm.loss_agg_func says over the global mini-batch.",
    ),
    CompatKey(
        "algorithm.calculate_entropy",
        False,
        "entropy is computed only for the entropy bonus.",
        "set algorithm.entropy_bonus > 0 to use it.",
    ),
    CompatKey("algorithm.rollout_batch_size_per_gpu", None, "prompts are split evenly over the agent-loop workers."),
    CompatKey(
        "algorithm.val_rollout_batch_size_per_gpu",
        1,
        "validation batches are data.val_rollout_batch_size prompts, split evenly over the engines.",
    ),
    # ---- runner
    CompatKey(
        "runner.enable_dynamic_batch_size",
        False,
        "micro-batches hold actor.micro_batch_size sequences.",
        "set algorithm.training_batch_size_per_gpu.",
    ),
    CompatKey("runner.max_tokens_per_mbs", None, "micro-batches are counted in sequences, not tokens."),
    # ---- data
    CompatKey(
        "data.filter_prompt_by_length", True, "training always drops prompts longer than data.max_prompt_length."
    ),
    CompatKey(
        "data.num_workers",
        0,
        "prompts are tokenised in memory at start; loader workers add nothing.",
        "set data.num_workers=0.",
    ),
    CompatKey(
        "data.validation_shuffle",
        False,
        "validation uses a fixed subset (runner.val_samples_per_benchmark, drawn with data.seed).",
    ),
    # ---- rollout
    CompatKey(
        "rollout.is_eval",
        Follows(
            ("runner.task_type",),
            lambda task: task == "reasoning_eval",
            "true exactly when runner.task_type=reasoning_eval",
        ),
        "evaluation is chosen by runner.task_type; the engine needs no flag of its own.",
        "remove it (runner.task_type=reasoning_eval selects evaluation).",
    ),
    CompatKey("rollout.validate_weight", False, "rlinf_ext's weight sync has no debug comparison of the weights."),
    CompatKey("rollout.validate_weight_first_sync", False, "no weight-norm check at the first sync is implemented."),
    CompatKey("rollout.validate_save_dir", None, "no weight comparison is saved."),
    CompatKey("rollout.padding", None, "the pad id is the tokenizer's pad_token_id."),
    CompatKey("rollout.eos", None, "the EOS ids are the tokenizer's and the model's generation config's."),
    CompatKey(
        "rollout.disable_log_stats",
        False,
        "engine stats logging is not configurable (the vLLM engine runs with its stats off).",
    ),
    CompatKey("rollout.print_outputs", False, "trajectories are printed by agentloop.print_outputs."),
    CompatKey("rollout.vllm.enable_flash_infer_sampler", True, "the vLLM engine runs with vLLM's own sampler choice."),
    CompatKey("rollout.vllm.torch_profiler_dir", None, "vLLM's torch profiler is not wired."),
    # ---- actor
    CompatKey(
        "actor.global_batch_size",
        None,
        "the global batch is derived: data.rollout_batch_size * algorithm.group_size / algorithm.n_minibatches.",
        "remove it; set algorithm.n_minibatches.",
    ),
    CompatKey("actor.mcore_gpt", True, "the actor is Megatron-core's GPTModel."),
    CompatKey(
        "actor.enable_dp_load_balance", False, "each data-parallel rank takes whole GRPO groups in arrival order."
    ),
    CompatKey("actor.calculate_flops", False, "no FLOP counter is implemented."),
    CompatKey(
        "actor.checkpoint_load_path",
        None,
        "the actor starts from rollout.model.model_path (HF) or resumes with runner.resume_dir.",
        "use runner.resume_dir=PATH/global_step_N to continue from a checkpoint.",
    ),
    CompatKey(
        "actor.megatron.use_hf_ckpt",
        True,
        "the actor always starts from rollout.model.model_path (HF), converted to Megatron in memory.",
        "set it to true (or remove it); continue from a checkpoint with runner.resume_dir.",
    ),
    CompatKey(
        "actor.megatron.ckpt_format",
        "torch",
        "actor checkpoints are Megatron's legacy torch layout (what mg2hf and resume read).",
    ),
    CompatKey(
        "actor.megatron.distributed_backend",
        Follows(
            ("cluster.num_gpus_per_node",),
            lambda gpus: "gloo" if gpus == 0 else "nccl",
            "gloo on a CPU cluster (cluster.num_gpus_per_node=0), nccl on GPUs",
        ),
        "the actor's collectives run on gloo on CPU and on nccl on GPUs, whatever this key says.",
    ),
    CompatKey(
        "actor.megatron.ckpt_convertor.model",
        None,
        "the actor converts with rlinf_ext's own Qwen2 mapping (rollout.model.model_type).",
    ),
    CompatKey(
        "actor.megatron.ckpt_convertor.hf_model_path",
        Follows(("rollout.model.model_path",), _same, "${rollout.model.model_path}"),
        "the actor starts from rollout.model.model_path, converted in memory; another path would be ignored.",
        "remove it, or set rollout.model.model_path to the checkpoint the actor should start from.",
    ),
    CompatKey(
        "actor.megatron.ckpt_convertor.tensor_model_parallel_size",
        Follows(("actor.model.tensor_model_parallel_size",), _same, "${actor.model.tensor_model_parallel_size}"),
        _NOT_WRITTEN,
    ),
    CompatKey(
        "actor.megatron.ckpt_convertor.pipeline_model_parallel_size",
        Follows(("actor.model.pipeline_model_parallel_size",), _same, "${actor.model.pipeline_model_parallel_size}"),
        _NOT_WRITTEN,
    ),
    CompatKey(
        "actor.megatron.ckpt_convertor.save_path",
        Follows(
            ("runner.output_dir", "runner.experiment_name"),
            lambda out, name: f"{out}/{name}/converted_ckpts/actor",
            "${runner.output_dir}/${runner.experiment_name}/converted_ckpts/actor",
        ),
        _NOT_WRITTEN,
    ),
    CompatKey(
        "actor.model.sequence_parallel",
        False,
        "sequence parallelism needs tensor parallelism; the actor runs TP=1 per process.",
        "set it to false.",
    ),
    CompatKey(
        "actor.model.variable_seq_lengths",
        True,
        "micro-batches are right-padded to their longest sequence, whatever the lengths.",
    ),
    CompatKey(
        "actor.model.seq_length",
        Follows(("runner.seq_length",), _same, "${runner.seq_length}"),
        "the actor's sequence length is runner.seq_length.",
        "remove it, or set runner.seq_length.",
    ),
    CompatKey(
        "actor.model.encoder_seq_length",
        Follows(("runner.seq_length",), _same, "${runner.seq_length}"),
        "the actor's sequence length is runner.seq_length.",
        "remove it, or set runner.seq_length.",
    ),
    *(
        CompatKey(f"actor.model.{key}", qwen2, _ARCH_WHY)
        for key, qwen2 in (
            ("activation", "swiglu"),
            ("normalization", "rmsnorm"),
            ("position_embedding_type", "rope"),
            ("add_bias_linear", False),
        )
    ),
    CompatKey(
        "actor.fsdp_config.strategy",
        "fsdp2",
        "the vision-language actor is sharded by torch FSDP2 (fully_shard per vision block, per decoder layer, root).",
    ),
    CompatKey("actor.fsdp_config.mixed_precision.buffer_dtype", "fp32", "the FSDP2 actor keeps its buffers in fp32."),
    CompatKey(
        "actor.tokenizer.tokenizer_model",
        Follows(("rollout.model.model_path",), _same, "${rollout.model.model_path}"),
        "training batches are tokenised with the tokenizer of rollout.model.model_path.",
    ),
    CompatKey("actor.tokenizer.use_fast", True, "the tokenizer is loaded with transformers' default (the fast one)."),
    CompatKey(
        "actor.tokenizer.trust_remote_code",
        False,
        "tokenizers are loaded as each engine needs; this switch is not wired.",
    ),
    CompatKey("actor.tokenizer.padding_side", "right", "training batches are right-padded."),
    # ---- reward
    CompatKey("reward.use_reward_model", False, "rewards are rule-based (the agent's reward function)."),
)

BY_KEY: dict[str, CompatKey] = {entry.key: entry for entry in COMPAT}


def is_compat_section(dotted: str) -> bool:
    """Is ``dotted`` a section that holds only compatibility keys below it (e.g. ``actor.tokenizer``)?"""
    return any(key.startswith(dotted + ".") for key in BY_KEY)


def same_value(value: Any, accepted: Any) -> bool:
    """Equality that keeps YAML's types apart (true is not 1, 1 is 1.0)."""
    if isinstance(value, bool) or isinstance(accepted, bool):
        return value is accepted
    return value == accepted


def accepted_value(entry: CompatKey, lookup: Callable[[str], Any]) -> Any:
    """The value ``entry`` accepts; ``lookup(dotted)`` reads another key's value (raises if it cannot)."""
    if isinstance(entry.accepted, Follows):
        return entry.accepted.value(*(lookup(source) for source in entry.accepted.sources))
    return entry.accepted


def refusal(entry: CompatKey, value: Any) -> tuple[str, str]:
    """(reason, fix) of a compatibility key set to a value rlinf_ext does not implement."""
    return (
        f"{entry.key}={_yaml(value)} is an RLinf setting that rlinf_ext does not implement: {entry.why}",
        entry.fix_text(),
    )


def with_compat_keys(tree: dict[str, Any], lookup: Callable[[str], Any]) -> dict[str, Any]:
    """``tree`` (a nested dict of the typed config) with every compatibility key added at its accepted value."""
    for entry in COMPAT:
        *parents, leaf = entry.key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = accepted_value(entry, lookup)
    return tree
