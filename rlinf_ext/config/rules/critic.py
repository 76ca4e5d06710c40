"""PPO-with-a-critic rules: the critic and GAE come together, the critic exists on the Megatron (text) actor only,
and its numbers are in range. The critic lives in the actor's processes (``training/critic.py``), so it needs no
placement of its own; its offload follows the actor's (collocated GPUs only)."""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.config.placement import PlacementError, is_collocated
from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue


def uses_critic(cfg: ExperimentConfig) -> bool:
    """A training run of PPO with a critic (``algorithm.adv_type=gae`` with ``critic.use_critic_model``)."""
    return is_training(cfg) and cfg.algorithm.adv_type == "gae" and cfg.critic.use_critic_model


@rule("algorithm.adv_type", "critic.use_critic_model", "runner.task_type")
def critic_goes_with_gae(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    gae, critic = cfg.algorithm.adv_type == "gae", cfg.critic.use_critic_model
    if not is_training(cfg) or gae == critic:
        return
    if gae:
        yield ConfigIssue(
            "critic.use_critic_model",
            "algorithm.adv_type=gae estimates advantages from a critic's "
            "values, but critic.use_critic_model=false builds none.",
            "set critic.use_critic_model=true, or algorithm.adv_type=grpo (no critic).",
        )
    else:
        yield ConfigIssue(
            "critic.use_critic_model",
            f"a critic with algorithm.adv_type={cfg.algorithm.adv_type}: "
            "group-relative advantages never read its values, so it would train for nothing.",
            "set algorithm.adv_type=gae (PPO), or critic.use_critic_model=false.",
        )


@rule("algorithm.adv_type", "critic.use_critic_model", "runner.task_type", "actor.training_backend")
def critic_needs_megatron_actor(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if uses_critic(cfg) and cfg.actor.training_backend != "megatron":
        yield ConfigIssue(
            "critic.use_critic_model",
            f"actor.training_backend={cfg.actor.training_backend}: the "
            "critic is the Megatron-core text model with a scalar head; the FSDP2 vision-language actor "
            "(Qwen2.5-VL through transformers) has no value model yet.",
            "train the vision-language agent with algorithm.adv_type=grpo and critic.use_critic_model=false.",
        )


@rule("algorithm.adv_type", "critic.use_critic_model", "runner.task_type", "runner.max_staleness")
def critic_is_synchronous(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if uses_critic(cfg) and cfg.runner.max_staleness > 0:
        yield ConfigIssue(
            "runner.max_staleness",
            f"runner.max_staleness={cfg.runner.max_staleness} with PPO's "
            "critic: batches rolled out ahead with a critic are not implemented or tested (the "
            "behaviour weights correct the policy loss only).",
            "set runner.max_staleness=0 for gae.",
        )


@rule(
    "algorithm.adv_type",
    "critic.use_critic_model",
    "runner.task_type",
    "algorithm.gamma",
    "algorithm.gae_lambda",
    "algorithm.value_clip",
    "critic.micro_batch_size",
    "critic.critic_warmup",
    "critic.optim.lr",
)
def critic_numbers(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if not uses_critic(cfg):
        return
    alg, critic = cfg.algorithm, cfg.critic
    if not 0.0 < alg.gamma <= 1.0:
        yield ConfigIssue(
            "algorithm.gamma", f"must be in (0, 1], got {alg.gamma}.", "set algorithm.gamma=1.0 (Search-R1's)."
        )
    if not 0.0 <= alg.gae_lambda <= 1.0:
        yield ConfigIssue(
            "algorithm.gae_lambda",
            f"must be in [0, 1], got {alg.gae_lambda}.",
            "set algorithm.gae_lambda=1.0 (Search-R1's).",
        )
    if alg.value_clip <= 0:
        yield ConfigIssue(
            "algorithm.value_clip",
            f"must be > 0, got {alg.value_clip}: the new values could not move.",
            "set algorithm.value_clip=0.5 (Search-R1's).",
        )
    if critic.micro_batch_size < 1:
        yield ConfigIssue(
            "critic.micro_batch_size",
            f"must be >= 1, got {critic.micro_batch_size}.",
            "set critic.micro_batch_size to 1 or more.",
        )
    if critic.critic_warmup < 0:
        yield ConfigIssue(
            "critic.critic_warmup",
            f"must be >= 0, got {critic.critic_warmup}.",
            "set critic.critic_warmup=0 (no warm-up) or a number of steps.",
        )
    if critic.optim.lr <= 0:
        yield ConfigIssue("critic.optim.lr", f"must be > 0, got {critic.optim.lr}.", "set critic.optim.lr=1e-5.")


@rule(
    "algorithm.adv_type",
    "critic.use_critic_model",
    "runner.task_type",
    "critic.offload",
    "cluster.num_nodes",
    "cluster.num_gpus_per_node",
    "cluster.component_placement",
)
def critic_offload_where_it_frees(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """The critic shares the actor's GPUs: collocated with the rollout it must leave them, as the actor does."""
    if not uses_critic(cfg) or cfg.cluster.num_gpus_per_node < 1:
        if uses_critic(cfg) and cfg.critic.offload:
            yield ConfigIssue(
                "critic.offload",
                "critic.offload=true on a CPU cluster: there is no GPU memory to free.",
                "set critic.offload=false.",
            )
        return
    try:
        collocated = is_collocated(cfg)
    except PlacementError:  # reported by the placement rule
        return
    if collocated and not cfg.critic.offload:
        yield ConfigIssue(
            "critic.offload",
            "critic.offload=false with the actor (and its critic) on the rollout's "
            "GPUs: the critic's weights and optimizer state would stay while the engine takes its memory "
            "back.",
            "set critic.offload=true, or place actor and rollout on disjoint GPUs.",
        )
    if not collocated and cfg.critic.offload:
        yield ConfigIssue(
            "critic.offload",
            "critic.offload=true with the actor and the rollout on disjoint GPUs: "
            "nothing else needs the actor's GPUs between phases.",
            "set critic.offload=false.",
        )
