"""Actor rules, checked before anything starts: the training backend that fits the model, offload where it
frees something, the starting checkpoint, and the Megatron knobs -- recompute settings Megatron-core's
``TransformerConfig`` would reject at build time (``transformer_config.py``: full needs a method and a layer count
in 1..num_layers, selective takes no count), settings Megatron would ignore silently (a method or count without
a granularity), Megatron's ``DistributedOptimizer`` being Adam-only on GPUs, and the sequence length the actor
reads (``runner.seq_length``; ``actor.model.seq_length`` / ``encoder_seq_length`` only mirror it).
"""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.config.placement import DISAGGREGATED, PlacementError, is_collocated, placement_mode
from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue


@rule("rollout.model.model_type", "actor.training_backend", "runner.task_type", "actor.fsdp_config.cpu_offload")
def vl_model_needs_fsdp(cfg):
    """Megatron-core 0.16.1 has no Qwen2.5-VL; the HF actor loads only Qwen2.5-VL."""
    vl, fsdp = cfg.rollout.model.model_type == "qwen2.5_vl", cfg.actor.training_backend == "fsdp"
    if vl and not fsdp and is_training(cfg):
        yield ConfigIssue(
            "actor.training_backend",
            "rollout.model.model_type=qwen2.5_vl trains with the FSDP2 actor "
            "(Megatron-core 0.16.1 has no Qwen2.5-VL model).",
            "set actor.training_backend=fsdp.",
        )
    if fsdp and not vl:
        yield ConfigIssue(
            "actor.training_backend",
            f"the fsdp actor trains Qwen2.5-VL models only, but "
            f"rollout.model.model_type={cfg.rollout.model.model_type}.",
            "set actor.training_backend=megatron for text models (or model_type=qwen2.5_vl).",
        )
    if fsdp and cfg.actor.fsdp_config.cpu_offload:
        yield ConfigIssue(
            "actor.fsdp_config.cpu_offload",
            "FSDP2's CPUOffloadPolicy (parameters kept on CPU, the "
            "optimizer step on CPU) is not implemented for the FSDP2 actor.",
            "set actor.fsdp_config.cpu_offload=false; actor.offload_weight / offload_optimizer free "
            "the GPUs for a collocated rollout between phases.",
        )


@rule(
    "runner.task_type",
    "cluster.num_nodes",
    "cluster.num_gpus_per_node",
    "cluster.component_placement",
    "actor.offload_weight",
    "actor.offload_optimizer",
)
def collocated_needs_offload(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Collocated GPUs: the rollout engine takes rollout.gpu_memory_utilization of each GPU back at every rollout
    while the actor still holds whatever it did not offload (fp32 weights, optimizer state: tens of GB for 3B).
    Both actors offload (Megatron's buffers; the FSDP2 actor's shards, training/fsdp_policy_offload.py)."""
    if not is_training(cfg) or cfg.cluster.num_gpus_per_node < 1:
        return
    try:
        collocated = is_collocated(cfg)
    except PlacementError:  # reported by the placement rule
        return
    if not collocated:
        return
    missing = [f"actor.{k}" for k in ("offload_weight", "offload_optimizer") if not getattr(cfg.actor, k)]
    if missing:
        yield ConfigIssue(
            missing[0],
            f"{' and '.join(missing)} false with the actor and the rollout on the same GPUs (collocated): the "
            f"rollout engine takes back rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} of every GPU at each "
            "rollout while the actor still holds that state, so the GPUs run out of memory.",
            f"set {' '.join(k + '=true' for k in missing)}, or place actor and rollout on disjoint GPUs.",
        )


@rule(
    "runner.task_type",
    "cluster.num_nodes",
    "cluster.num_gpus_per_node",
    "cluster.component_placement",
    "actor.training_backend",
    "actor.offload_weight",
    "actor.offload_optimizer",
    "actor.offload_grad",
)
def offload_has_something_to_free(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """actor.offload_* moves actor state off the GPUs it shares with the rollout; elsewhere it would do nothing."""
    flags = [f"actor.{k}" for k in ("offload_weight", "offload_optimizer", "offload_grad") if getattr(cfg.actor, k)]
    gpn = cfg.cluster.num_gpus_per_node
    if not flags or not is_training(cfg):
        return
    fix = f"set {' '.join(k + '=false' for k in flags)}"
    if gpn < 1:
        yield ConfigIssue(
            flags[0],
            f"{', '.join(flags)} true on a CPU cluster (cluster.num_gpus_per_node=0): there is "
            "no GPU memory to free, so nothing would be offloaded.",
            fix + ".",
        )
        return
    try:
        mode = placement_mode(cfg)
    except PlacementError:  # reported by the placement rule
        return
    if mode == DISAGGREGATED:
        yield ConfigIssue(
            flags[0],
            f"{', '.join(flags)} true with the actor and the rollout on disjoint GPUs "
            "(disaggregated): the runner offloads only for a rollout on the actor's GPUs, so nothing "
            "would be offloaded.",
            fix + " (or collocate actor and rollout).",
        )


_RECOMPUTE = ("actor.model.recompute_granularity", "actor.model.recompute_method", "actor.model.recompute_num_layers")


@rule(*_RECOMPUTE, "actor.model.num_layers")
def recompute_settings_are_consistent(cfg):
    m = cfg.actor.model
    granularity, method, layers = m.recompute_granularity, m.recompute_method, m.recompute_num_layers
    total = m.num_layers
    if granularity is None:
        if method is not None or layers is not None:
            yield ConfigIssue(
                "actor.model.recompute_granularity",
                f"recompute_method={method!r} / recompute_num_layers={layers!r} do nothing without a granularity.",
                "set actor.model.recompute_granularity=full (or remove the method and layer count).",
            )
    elif granularity == "full":
        if method is None:
            yield ConfigIssue(
                "actor.model.recompute_method",
                "recompute_granularity=full needs a method.",
                "set actor.model.recompute_method=block (first N layers) or uniform (every layer, in units of N).",
            )
        if layers is None or layers < 1 or (total is not None and layers > total):
            bound = f"1..{total}" if total is not None else ">= 1"
            yield ConfigIssue(
                "actor.model.recompute_num_layers",
                f"recompute_granularity=full needs recompute_num_layers in {bound}, got {layers!r}.",
                f"set actor.model.recompute_num_layers={total or 1} (block: every layer) or 1 "
                "(uniform: one layer per unit).",
            )
    elif granularity == "selective" and layers is not None:
        yield ConfigIssue(
            "actor.model.recompute_num_layers",
            "recompute_granularity=selective recomputes the core attention of every layer; Megatron "
            "refuses a layer count with it.",
            "remove actor.model.recompute_num_layers.",
        )


@rule("actor.optim.optimizer", "actor.optim.use_distributed_optimizer", "cluster.num_gpus_per_node", "runner.task_type")
def distributed_optimizer_is_adam(cfg):
    a = cfg.actor.optim
    if is_training(cfg) and cfg.cluster.num_gpus_per_node > 0 and a.use_distributed_optimizer and a.optimizer != "adam":
        yield ConfigIssue(
            "actor.optim.use_distributed_optimizer",
            f"Megatron's DistributedOptimizer supports Adam only, and actor.optim.optimizer={a.optimizer!r}.",
            "set actor.optim.use_distributed_optimizer=false (or actor.optim.optimizer=adam).",
        )
