"""Keys rlinf_ext reads whose other values it supports only in some settings: refused there with the reason.

RLinf's keys that rlinf_ext does not implement at all are not here: they are in ``config/compat.py``, which the
structural check consults. Megatron's actor knobs are wired into the actor (``training/settings.py``) and checked
in ``config/rules_actor.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue

FUSED_KERNEL_SWITCHES = ("apply_rope_fusion", "bias_dropout_fusion", "bias_activation_fusion", "persist_layer_norm",
                         "gradient_accumulation_fusion")


@rule("data.apply_chat_template", "runner.task_type")
def training_prompts_are_preformatted(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if is_training(cfg) and cfg.data.apply_chat_template:
        yield ConfigIssue(
            "data.apply_chat_template",
            "data.apply_chat_template=true: training prompts are used as written (evaluation may apply the chat "
            "template; rlinf-ext preprocess applies it to training data).",
            "preprocess the data with rlinf-ext preprocess and set data.apply_chat_template=false.",
        )


@rule(*(f"actor.model.{key}" for key in FUSED_KERNEL_SWITCHES), "cluster.num_gpus_per_node")
def no_fused_kernels_on_cpu(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.cluster.num_gpus_per_node > 0:
        return
    for key in FUSED_KERNEL_SWITCHES:
        if getattr(cfg.actor.model, key):
            yield ConfigIssue(
                f"actor.model.{key}",
                f"actor.model.{key}=true: fused kernels are CUDA-only; the CPU actor runs Megatron's unfused path.",
                f"set actor.model.{key}=false on a CPU cluster.",
            )
