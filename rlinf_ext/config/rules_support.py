"""Keys the schema accepts because RLinf's configs have them, but that rlinf_ext's own actor, rollout workers and
trainer do not implement. A value other than the one rlinf_ext behaves as is refused by ``validate``, naming the key
and what to do instead, so that no setting is silently ignored.

Megatron's actor knobs (``actor.model.recompute_*``, the fusion switches, ``actor.offload_grad``,
``actor.optim.use_distributed_optimizer``, ``actor.spec_name``) are not listed: they are wired into the actor.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue


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
