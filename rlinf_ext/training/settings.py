"""What the actor reads from the experiment config, read once at the edge into ``ActorSettings``.

``MegatronPolicy`` never sees the config: every value it uses is a field here, checked where it is read (the
error names the key). Names follow RLinf (``config/schema.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rlinf_ext.config.schema import ActorModelConfig, ExperimentConfig, SamplingParamsConfig
from rlinf_ext.training.rl_math import LossConfig

# actor.model keys that are Megatron TransformerConfig fields of the same name, passed through as set
TRANSFORMER_CONFIG_KEYS = (
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "apply_rope_fusion",
    "bias_dropout_fusion",
    "bias_activation_fusion",
    "persist_layer_norm",
    "attention_softmax_in_fp32",
    "gradient_accumulation_fusion",
    "use_cpu_initialization",
)


def sampling_temperature(sampling_params: SamplingParamsConfig) -> float:
    """The temperature the rollout samples with (1.0 when decoding is greedy or the temperature is not positive)."""
    temperature = float(getattr(sampling_params, "temperature", 1.0) or 1.0)
    if getattr(sampling_params, "do_sample", True) is False or temperature <= 0:
        return 1.0
    return temperature


@dataclass
class ActorSettings:
    """What the actor reads from the experiment config (names follow RLinf; see config/schema.py)."""

    group_size: int
    n_minibatches: int = 1
    micro_batch_size: int = 1
    logprob_micro_batch_size: int = 1
    adv_type: str = "grpo"
    advantage_mode: str = "trajectory"
    loss: LossConfig = field(default_factory=LossConfig)
    # runner.max_staleness > 0 with a behaviour weight: a step whose trajectories carry no engine log-probs is refused
    # (stale samples would otherwise train without their correction, silently)
    behaviour_required: bool = False
    shuffle_rollout: bool = False
    optimizer: str = "adam"
    lr: float = 1e-6
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-5
    clip_grad: float = 1.0
    lr_warmup_fraction: float = 0.0
    lr_decay_style: str = "constant"
    min_lr: float = 0.0
    total_train_steps: int = 1  # rollout steps of the run (the LR schedule spans total * n_minibatches)
    precision: str = "fp32"
    loss_scale: float | None = None  # fp16 only: static loss scale (None = dynamic)
    seed: int = 1234
    loss_agg_func: str = "token-mean"
    # the rollout's sampling temperature: log-probs are those of the distribution the tokens were sampled from
    # (logits / temperature), as RLinf's actor computes them; 1.0 for greedy or untempered sampling
    temperature: float = 1.0
    # Megatron: TransformerConfig fields (TRANSFORMER_CONFIG_KEYS), layer spec, optimizer sharding, offload
    model_overrides: dict[str, Any] = field(default_factory=dict)
    spec_name: str = "decoder_gpt"
    use_distributed_optimizer: bool = True
    offload_weight: bool = False
    offload_optimizer: bool = False
    offload_grad: bool = False
    logprob_chunk_tokens: int = 512
    distributed_timeout_minutes: int = 30

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, total_train_steps: int) -> ActorSettings:
        alg, actor = cfg.algorithm, cfg.actor
        off_policy = alg.off_policy
        staleness = int(cfg.runner.max_staleness)  # 0: batches trained by the weights that sampled them
        if alg.loss_agg_func != "token-mean":
            raise ValueError(f"algorithm.loss_agg_func={alg.loss_agg_func!r}: only 'token-mean' is implemented.")
        if alg.kl_beta > 0 and alg.kl_penalty_type != "low_var_kl":
            raise ValueError(f"algorithm.kl_penalty_type={alg.kl_penalty_type!r}: only 'low_var_kl' is implemented.")
        if alg.normalize_advantages:
            raise ValueError(
                "algorithm.normalize_advantages=True is not supported: GRPO's advantages are normalised "
                "within groups (RLinf asserts it off) and gae whitens its own (training/ppo_math.py)."
            )
        return cls(
            group_size=int(alg.group_size),
            n_minibatches=int(alg.n_minibatches),
            micro_batch_size=int(actor.micro_batch_size),
            logprob_micro_batch_size=int(alg.logprob_forward_micro_batch_size),
            adv_type=str(alg.adv_type),
            advantage_mode=str(alg.advantage_mode),
            loss=LossConfig(
                ratio_clip_eps=float(alg.ratio_clip_eps),
                clip_ratio_c=None if alg.clip_ratio_c is None else float(alg.clip_ratio_c),
                kl_beta=float(alg.kl_beta),
                entropy_bonus=float(alg.entropy_bonus),
                behaviour_weight=str(off_policy.behaviour_weight),
                behaviour_weight_cap=float(off_policy.behaviour_weight_cap),
                behaviour_weight_floor=float(off_policy.behaviour_weight_floor),
            ),
            behaviour_required=staleness > 0 and off_policy.behaviour_weight != "none",
            shuffle_rollout=bool(alg.shuffle_rollout),
            optimizer=str(actor.optim.optimizer),
            lr=float(actor.optim.lr),
            weight_decay=float(actor.optim.weight_decay),
            adam_beta1=float(actor.optim.adam_beta1),
            adam_beta2=float(actor.optim.adam_beta2),
            adam_eps=float(actor.optim.adam_eps),
            clip_grad=float(actor.optim.clip_grad),
            lr_warmup_fraction=float(actor.lr_sched.lr_warmup_fraction),
            lr_decay_style=str(actor.lr_sched.lr_decay_style),
            min_lr=float(actor.lr_sched.min_lr),
            total_train_steps=max(int(total_train_steps), 1),
            precision=str(actor.model.precision),
            loss_scale=None if actor.optim.loss_scale is None else float(actor.optim.loss_scale),
            seed=int(actor.seed),
            temperature=sampling_temperature(alg.sampling_params),
            model_overrides=transformer_overrides(actor.model),
            spec_name=str(actor.spec_name),
            use_distributed_optimizer=bool(actor.optim.use_distributed_optimizer),
            offload_weight=bool(actor.offload_weight),
            offload_optimizer=bool(actor.offload_optimizer),
            offload_grad=bool(actor.offload_grad),
            logprob_chunk_tokens=int(actor.logprob_chunk_tokens),
            distributed_timeout_minutes=int(actor.megatron.distributed_timeout_minutes),
        )


def transformer_overrides(model: ActorModelConfig) -> dict[str, Any]:
    """The ``actor.model`` keys Megatron's ``TransformerConfig`` takes as they are (recompute, fusions)."""
    return {key: getattr(model, key) for key in TRANSFORMER_CONFIG_KEYS}


@dataclass(frozen=True)
class CriticSettings:
    """PPO's critic (``critic.*`` and the GAE keys of ``algorithm``): ``train`` is the critic's own optimizer and
    micro-batch settings, otherwise the actor's (same model knobs, precision, seed, LR schedule shape)."""

    train: ActorSettings
    model_path: str
    gamma: float = 1.0
    gae_lambda: float = 1.0
    value_clip: float = 0.5
    critic_warmup: int = 0

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, actor: ActorSettings) -> CriticSettings:
        critic, alg, optim = cfg.critic, cfg.algorithm, cfg.critic.optim
        offload = bool(critic.offload)
        train = replace(
            actor,
            micro_batch_size=int(critic.micro_batch_size),
            logprob_micro_batch_size=int(critic.micro_batch_size),
            optimizer=str(optim.optimizer),
            lr=float(optim.lr),
            weight_decay=float(optim.weight_decay),
            adam_beta1=float(optim.adam_beta1),
            adam_beta2=float(optim.adam_beta2),
            adam_eps=float(optim.adam_eps),
            clip_grad=float(optim.clip_grad),
            use_distributed_optimizer=bool(optim.use_distributed_optimizer),
            loss_scale=None if optim.loss_scale is None else float(optim.loss_scale),
            offload_weight=offload,
            offload_optimizer=offload,
            offload_grad=offload,
        )
        return cls(
            train=train,
            model_path=str(critic.model_path),
            gamma=float(alg.gamma),
            gae_lambda=float(alg.gae_lambda),
            value_clip=float(alg.value_clip),
            critic_warmup=int(critic.critic_warmup),
        )
