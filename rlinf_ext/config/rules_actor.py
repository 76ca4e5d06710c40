"""Rules on the actor's Megatron knobs, checked before anything starts: the recompute settings Megatron-core's
``TransformerConfig`` would reject at build time (``transformer_config.py``: full needs a method and a layer count
in 1..num_layers, selective takes no count), settings Megatron would ignore silently (a method or count without
a granularity), Megatron's ``DistributedOptimizer`` being Adam-only on GPUs, and the sequence length the actor
reads (``runner.seq_length``; ``actor.model.seq_length`` / ``encoder_seq_length`` only mirror it).
"""

from __future__ import annotations

from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.structure import ConfigIssue

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
            yield ConfigIssue("actor.model.recompute_method", "recompute_granularity=full needs a method.",
                              "set actor.model.recompute_method=block (first N layers) or uniform (every layer, "
                              "in units of N).")
        if layers is None or layers < 1 or (total is not None and layers > total):
            bound = f"1..{total}" if total is not None else ">= 1"
            yield ConfigIssue("actor.model.recompute_num_layers",
                              f"recompute_granularity=full needs recompute_num_layers in {bound}, got {layers!r}.",
                              f"set actor.model.recompute_num_layers={total or 1} (block: every layer) or 1 "
                              "(uniform: one layer per unit).")
    elif granularity == "selective" and layers is not None:
        yield ConfigIssue("actor.model.recompute_num_layers",
                          "recompute_granularity=selective recomputes the core attention of every layer; Megatron "
                          "refuses a layer count with it.", "remove actor.model.recompute_num_layers.")


@rule("actor.optim.optimizer", "actor.optim.use_distributed_optimizer", "cluster.num_gpus_per_node", "runner.task_type")
def distributed_optimizer_is_adam(cfg):
    a = cfg.actor.optim
    if is_training(cfg) and cfg.cluster.num_gpus_per_node > 0 and a.use_distributed_optimizer and a.optimizer != "adam":
        yield ConfigIssue(
            "actor.optim.use_distributed_optimizer",
            f"Megatron's DistributedOptimizer supports Adam only, and actor.optim.optimizer={a.optimizer!r}.",
            "set actor.optim.use_distributed_optimizer=false (or actor.optim.optimizer=adam).",
        )


@rule("actor.model.seq_length", "actor.model.encoder_seq_length", "runner.seq_length")
def actor_sequence_length_is_the_runners(cfg):
    for key in ("seq_length", "encoder_seq_length"):
        value = getattr(cfg.actor.model, key)
        if value != cfg.runner.seq_length:
            yield ConfigIssue(
                f"actor.model.{key}",
                f"actor.model.{key}={value} differs from runner.seq_length={cfg.runner.seq_length}; the actor (and its "
                "memory plan) use runner.seq_length.",
                f"remove actor.model.{key} (it follows runner.seq_length) or set runner.seq_length={value}.",
            )
