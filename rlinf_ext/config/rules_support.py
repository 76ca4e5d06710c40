"""Keys the schema accepts because RLinf's configs have them, but that rlinf_ext's own actor, rollout workers and
trainer do not implement. A value other than the one rlinf_ext behaves as is refused by ``validate``, naming the key
and what to do instead, so that no setting is silently ignored.

Megatron's actor knobs are not listed because they are wired into the actor: ``actor.model.recompute_*``, the
fusion switches (``apply_rope_fusion``, ``bias_dropout_fusion``, ``bias_activation_fusion``, ``persist_layer_norm``,
``gradient_accumulation_fusion``), ``attention_softmax_in_fp32`` and ``use_cpu_initialization`` become Megatron
``TransformerConfig`` fields (``training/settings.py:TRANSFORMER_CONFIG_KEYS``); ``actor.spec_name`` picks the layer
spec; ``actor.optim.use_distributed_optimizer`` shards the optimizer state; ``actor.offload_weight / offload_optimizer
/ offload_grad`` drive the offload; ``actor.megatron.distributed_timeout_minutes`` is the process-group timeout.
Their consistency is checked in ``config/rules_actor.py``; the fusion switches are refused on CPU clusters only (the
fused kernels are CUDA's). The Qwen2 architecture switches (``actor.model.activation``...) are refused when they
differ from Qwen2's: the actor reads the architecture from the checkpoint's config.json.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue

_ARCH_WHY = ("the actor builds the Qwen2 architecture from the checkpoint's config.json (SwiGLU, RMSNorm, RoPE, "
             "biases on q/k/v only); RLinf's switch for other models has no effect here.")


@dataclass(frozen=True)
class Unsupported:
    key: str
    supported: Any  # the one value rlinf_ext behaves as
    why: str
    fix: str
    applies: Callable[[ExperimentConfig], bool] = lambda cfg: True


UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported("algorithm.sampling_params.min_new_tokens", 1,
                "the rollout engines enforce no minimum turn length.", "remove it (1 = no minimum)."),
    Unsupported("algorithm.clip_ratio_low", None, "the policy loss clips symmetrically.",
                "set algorithm.ratio_clip_eps instead."),
    Unsupported("algorithm.clip_ratio_high", None, "the policy loss clips symmetrically.",
                "set algorithm.ratio_clip_eps instead."),
    Unsupported("algorithm.early_stop_imp_ratio", None, "the actor never skips an update on the importance ratio.",
                "remove it."),
    Unsupported("algorithm.use_valid_token_scale", False,
                "the loss is always the token mean over the global mini-batch.", "remove it."),
    Unsupported("algorithm.calculate_entropy", False,
                "entropy is computed only for the entropy bonus.", "set algorithm.entropy_bonus > 0 to use it."),
    Unsupported("algorithm.max_num_gen_batches", 1, "dynamic-sampling refills are not implemented.", "set it to 1."),
    Unsupported("algorithm.rollout_batch_size_per_gpu", None,
                "prompts are split evenly over the agent-loop workers.", "remove it."),
    Unsupported("runner.enable_dynamic_batch_size", False,
                "micro-batches hold actor.micro_batch_size sequences.", "set algorithm.training_batch_size_per_gpu."),
    Unsupported("runner.max_tokens_per_mbs", None, "micro-batches are counted in sequences, not tokens.",
                "remove it."),
    Unsupported("data.filter_prompt_by_length", True,
                "training always drops prompts longer than data.max_prompt_length.", "remove it."),
    Unsupported("data.apply_chat_template", False,
                "training prompts are used as written (rlinf-ext preprocess applies the chat template).",
                "preprocess the data with rlinf-ext preprocess and set data.apply_chat_template=false.", is_training),
    Unsupported("data.num_workers", 0, "prompts are tokenised in memory at start; loader workers add nothing.",
                "set data.num_workers=0."),
    Unsupported("data.validation_shuffle", False, "validation uses a fixed subset (runner.val_samples_per_benchmark).",
                "remove it."),
    Unsupported("actor.enable_dp_load_balance", False,
                "each data-parallel rank takes whole GRPO groups in arrival order.", "remove it."),
    Unsupported("actor.calculate_flops", False, "no FLOP counter is implemented.", "remove it."),
    Unsupported("actor.checkpoint_load_path", None,
                "the actor starts from rollout.model.model_path (HF) or resumes with runner.resume_dir.",
                "use runner.resume_dir=PATH/global_step_N to continue from a checkpoint."),
    Unsupported("actor.megatron.use_hf_ckpt", True,
                "the actor always starts from rollout.model.model_path (HF), converted to Megatron in memory.",
                "set it to true (or remove it); continue from a checkpoint with runner.resume_dir.", is_training),
    Unsupported("actor.model.sequence_parallel", False,
                "sequence parallelism needs tensor parallelism; the actor runs TP=1 per process.", "set it to false."),
    *(Unsupported(f"actor.model.{key}", qwen2, _ARCH_WHY, "remove it.") for key, qwen2 in (
        ("activation", "swiglu"), ("normalization", "rmsnorm"), ("position_embedding_type", "rope"),
        ("add_bias_linear", False))),
    Unsupported("actor.model.variable_seq_lengths", True,
                "micro-batches are right-padded to their longest sequence, whatever the lengths.", "remove it."),
    Unsupported("actor.mcore_gpt", True, "the actor is Megatron-core's GPTModel.", "remove it."),
    Unsupported("actor.megatron.ckpt_format", "torch",
                "actor checkpoints are Megatron's legacy torch layout (what mg2hf and resume read).", "remove it."),
    Unsupported("actor.megatron.distributed_backend", "gloo", "the CPU actor's collectives run on gloo.",
                "set actor.megatron.distributed_backend=gloo.", lambda cfg: cfg.cluster.num_gpus_per_node == 0),
    Unsupported("actor.megatron.distributed_backend", "nccl", "the actor's collectives on GPUs run on nccl.",
                "set actor.megatron.distributed_backend=nccl.", lambda cfg: cfg.cluster.num_gpus_per_node > 0),
    *(Unsupported(f"actor.model.{key}", False, "fused kernels are CUDA-only; the CPU actor runs Megatron's unfused "
                  "path.", f"set actor.model.{key}=false on a CPU cluster.", lambda cfg: cfg.cluster.num_gpus_per_node == 0)
      for key in ("apply_rope_fusion", "bias_dropout_fusion", "bias_activation_fusion", "persist_layer_norm",
                  "gradient_accumulation_fusion")),
)


def _get(cfg: ExperimentConfig, dotted: str) -> Any:
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def unsupported_issues(cfg: ExperimentConfig) -> list[ConfigIssue]:
    issues = []
    for item in UNSUPPORTED:
        value = _get(cfg, item.key)
        if item.applies(cfg) and value != item.supported:
            issues.append(ConfigIssue(
                item.key,
                f"{item.key}={value!r} is accepted for RLinf compatibility but rlinf_ext does not implement it: "
                f"{item.why}",
                item.fix,
            ))
    return issues


@rule(*(item.key for item in UNSUPPORTED), "runner.task_type")
def no_silently_ignored_keys(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    yield from unsupported_issues(cfg)
