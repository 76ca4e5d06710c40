"""Names of the metrics a training step logs (TensorBoard, wandb, ``metrics.jsonl``), in one place.

Producers: the reward worker (``reward/...``), the agent loop (``agent/...``, ``agent_metric``), the actor
(``rollout/...`` and ``actor/...`` with the trainer's prefixes), the trainer (``time/...``, ``throughput/...``) and
validation (Search-R1: ``val/<bench>/<metric>``, ``val/avg/...``, ``val/all/...``, ``validation_metric``;
MMSearch-R1: ``val/<category>/<column>``, ``mm_category_metric(..., VAL_PREFIX)``). Readers: the
metrics sink, the run summary, benchmarks and tests.
"""

from __future__ import annotations

# reward worker
REWARD_MEAN = "reward/mean"
REWARD_EM = "reward/em"
REWARD_MAX = "reward/max"
REWARD_MIN = "reward/min"
# share of the step's groups whose rewards are not all equal: the groups with a non-zero GRPO advantage
REWARD_MIXED_GROUPS = "reward/mixed_groups"

# agent loop: means over trajectories of Trajectory.metrics, under agent/<name>
AGENT_PREFIX = "agent"
AGENT_SEARCHES = "agent/searches"
AGENT_SEARCH_FAILURE_RATE = "agent/search_failure_rate"
# MMSearch-R1: share of the step's trajectories whose ids (image pad runs) differ from what the actor's processor
# makes of the same conversation (agent/mmsearch/retokenize.py)
AGENT_RETOKENIZE_MISMATCH = "agent/retokenize_mismatch"
AGENT_IMAGE_PAD_MISMATCH = "agent/image_pad_mismatch"

# actor: RLinf's rollout metrics under rollout/<name>, training metrics under actor/<name>
ROLLOUT_PREFIX = "rollout"
# rollout engines with images (vLLM, SGLang): share of the step's generate requests whose prompt the engine expanded
# differently from the agent loop's ids; the trainer logs it per step from the rollout workers' state, where
# RETOKENIZE_COUNTS holds the cumulative (mismatches, prompts checked) since the engine started
RETOKENIZE_MISMATCH = "rollout/retokenize_mismatch"
RETOKENIZE_COUNTS = "retokenize_counts"
SYNC_LOGPROB_GAP = "rollout/sync_logprob_gap"  # the engine's probe log-probs vs the actor's after the step's sync
ACTOR_PREFIX = "actor"
ACTOR_LOSS = "actor/loss"
ACTOR_OPTIMIZER_STEPS = "actor/optimizer_steps"
# decoupled PPO (training/rl_math.py:behaviour_weights), over the loss tokens, only on steps whose samples carry the
# engine's log-probs: the mean applied weight pi_prox / pi_behav (after truncation or masking), the fraction of
# tokens truncated or masked, and the k3 (low-variance) estimate of KL(pi_behav || pi_prox)
ACTOR_BEHAVIOUR_WEIGHT_MEAN = "actor/behaviour_weight_mean"
ACTOR_BEHAVIOUR_WEIGHT_CLIP_FRACTION = "actor/behaviour_weight_clip_fraction"
ACTOR_BEHAVIOUR_KL = "actor/behaviour_kl"
ACTOR_BEHAVIOUR_METRICS = (ACTOR_BEHAVIOUR_WEIGHT_MEAN, ACTOR_BEHAVIOUR_WEIGHT_CLIP_FRACTION, ACTOR_BEHAVIOUR_KL)

# PPO's critic (training/ppo_math.py:value_loss), over the loss tokens, on steps with algorithm.adv_type: gae: the
# clipped value loss, the share of tokens whose clipped term was the larger, the mean value and the explained
# variance 1 - Var(returns - values) / Var(returns)
CRITIC_PREFIX = "critic"
CRITIC_VALUE_LOSS = "critic/value_loss"
CRITIC_VF_EXPLAINED_VAR = "critic/vf_explained_var"
CRITIC_VALUES_MEAN = "critic/values_mean"
CRITIC_VALUE_CLIP_FRAC = "critic/value_clip_frac"
CRITIC_METRICS = (CRITIC_VALUE_LOSS, CRITIC_VF_EXPLAINED_VAR, CRITIC_VALUES_MEAN, CRITIC_VALUE_CLIP_FRAC)

# trainer: phase times (seconds) and throughput
TIME_ROLLOUT = "time/rollout"
TIME_TOOL = "time/tool"
TIME_RECOMPUTE = "time/recompute"
TIME_TRAIN = "time/train"
TIME_SYNC = "time/sync"  # actor -> rollout weight sync; absent on a step whose engine already held the weights
TIME_ROLLOUT_START = "time/rollout_start"  # rollout engine start-up with its model load (max over ranks); once
#                                            per launch, in the launch's first row
TIME_STEP = "time/step"
TIME_VALIDATION = "time/validation"
THROUGHPUT_TOKENS_PER_S = "throughput/tokens_per_s"

# trainer, batches dispatched ahead (runner.max_staleness = k; runner/staleness.py computes them)
STALENESS_HEAD_MAX = "async/staleness_head_max"  # global_step at training - weight version at the group's dispatch
STALENESS_HEAD_MEAN = "async/staleness_head_mean"
TRAJECTORIES_TWO_VERSIONS = "async/trajectories_two_versions"  # share sampled by more than one weight version
STALENESS_TOKEN_MAX = "async/staleness_token_max"  # global_step at training - the oldest sampled token's version
TIME_WAIT_ROLLOUT = "time/wait_rollout"  # the driver blocked on the rollout of the batch it trains
TIME_ACTOR_IDLE_RATIO = "time/actor_idle_ratio"  # time/wait_rollout / time/step
TIME_ROLLOUT_IDLE_RATIO = "time/rollout_idle_ratio"  # share of time/step with no batch being rolled out

# trainer, dynamic sampling (algorithm.adv_type: grpo_dynamic; runner/dynamic_sampling.py): per step, the groups with
# mixed rewards trained, the all-equal groups generated, the batches generated (1 .. algorithm.max_num_gen_batches)
# and the all-equal groups trained to complete the actor's last share unit (none when enough groups were kept)
DYNAMIC_KEPT_GROUPS = "dynamic/kept_groups"
DYNAMIC_DROPPED_GROUPS = "dynamic/dropped_groups"
DYNAMIC_GEN_BATCHES = "dynamic/gen_batches"
DYNAMIC_PADDED_GROUPS = "dynamic/padded_groups"


def token_staleness(j: int) -> str:
    """``async/token_staleness_<j>``: the share of the step's sampled tokens generated ``j`` versions before the
    weights that train them."""
    return f"async/token_staleness_{j}"


# validation
VAL_PREFIX = "val"
VAL_ALL_EM = "val/all/em"
VAL_AVG_EM = "val/avg/em"
VAL_N = "val/n"
VAL_ERRORS = "val/errors"


def agent_metric(name: str) -> str:
    """``agent/<name>`` for a ``Trajectory.metrics`` entry."""
    return f"{AGENT_PREFIX}/{name}"


def prefixed(prefix: str, name: str) -> str:
    """``<prefix>/<name>`` (rollout/..., actor/...)."""
    return f"{prefix}/{name}"


def actor_name(key: str) -> str:
    """The name under which the actor returns an ``actor/<name>`` metric (the trainer adds the prefix back)."""
    return key.removeprefix(ACTOR_PREFIX + "/")


def mm_category_metric(category: str, name: str, prefix: str = ROLLOUT_PREFIX) -> str:
    """``rollout/<category>/<name>``: MMSearch-R1 metrics split by FVQA category (search_required, search_free,
    all); the names are ``agent/mmsearch/metrics.py``'s table columns."""
    return f"{prefix}/{category}/{name}"


# the MMSearch-R1 trends the run summary and the reward plot show: (key, label)
MM_TRENDS = (
    ("rollout/search_free/search_ratio_image", "image-search ratio, search_free"),
    ("rollout/search_free/accuracy", "accuracy, search_free"),
    ("rollout/search_required/search_ratio_image", "image-search ratio, search_required"),
    ("rollout/search_required/accuracy", "accuracy, search_required"),
)


def validation_metric(scope: str, name: str, prefix: str = VAL_PREFIX) -> str:
    """``val/<scope>/<name>``; scope is a benchmark name, ``avg`` (mean over benchmarks) or ``all`` (pooled)."""
    return f"{prefix}/{scope}/{name}"
