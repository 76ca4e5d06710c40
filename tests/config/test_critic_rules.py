"""PPO's critic rules: the critic and gae only together, the Megatron actor only, numbers in range, offload where it
frees GPU memory; each refusal names the key and the fix."""

from __future__ import annotations

import pytest

from rlinf_ext.config import check_config

PPO = ["algorithm.adv_type=gae", "critic.use_critic_model=true"]


def _issue(name, overrides, key):
    result = check_config(name, overrides)
    by_key = {i.key: i for i in result.issues}
    assert key in by_key, [str(i) for i in result.issues]
    issue = by_key[key]
    assert issue.fix.strip()
    return f"{issue.reason} {issue.fix}"


def test_ppo_on_the_tiny_config_is_accepted():
    assert check_config("tiny-cpu", PPO).ok


def test_critic_and_gae_come_together():
    text = _issue("tiny-cpu", ["algorithm.adv_type=gae"], "critic.use_critic_model")
    assert "critic.use_critic_model=true" in text
    text = _issue("tiny-cpu", ["critic.use_critic_model=true"], "critic.use_critic_model")
    assert "algorithm.adv_type=gae" in text


def test_the_fsdp_vision_language_actor_has_no_critic():
    text = _issue("tiny-mm-cpu", PPO, "critic.use_critic_model")
    assert "FSDP2" in text and "adv_type=grpo" in text


@pytest.mark.parametrize(
    "override, key",
    [
        ("algorithm.gamma=0", "algorithm.gamma"),
        ("algorithm.gae_lambda=1.5", "algorithm.gae_lambda"),
        ("algorithm.value_clip=0", "algorithm.value_clip"),
        ("critic.micro_batch_size=0", "critic.micro_batch_size"),
        ("critic.critic_warmup=-1", "critic.critic_warmup"),
        ("critic.optim.lr=0", "critic.optim.lr"),
        ("critic.offload=true", "critic.offload"),  # a CPU cluster: nothing to free
        ("runner.max_staleness=1", "runner.max_staleness"),
    ],
)
def test_out_of_range_is_refused(override, key):
    assert key in _issue("tiny-cpu", PPO + [override], key)


def test_collocated_gpus_need_the_critic_offloaded(reference_env):
    # the reference config is collocated and offloads its actor: the critic follows actor.offload_weight
    assert check_config("qwen2.5-3b-tool-1node", PPO).ok
    assert "critic.offload=true" in _issue("qwen2.5-3b-tool-1node", PPO + ["critic.offload=false"], "critic.offload")


def test_the_memory_plan_counts_the_critic(reference_env):
    from rlinf_ext.config import load_config
    from rlinf_ext.config.memory_plan import format_memory, gpu_plan, memory_inputs
    from rlinf_ext.models.memory import CRITIC_GRADS, CRITIC_STATE

    grpo = load_config("qwen2.5-3b-tool-1node")
    ppo = load_config("qwen2.5-3b-tool-1node", PPO)
    (xg, _), (xp, _) = memory_inputs(grpo), memory_inputs(ppo)
    plan_g, plan_p = gpu_plan(grpo, xg), gpu_plan(ppo, xp)
    items = plan_p.actor.items
    # a second model without a reference: its weights, fp32 main params and Adam state, and its fp32 gradients
    assert items[CRITIC_GRADS] == plan_g.actor.items["gradients"]
    assert items[CRITIC_STATE] == sum(
        plan_g.actor.items[k] for k in ("weights", "main params (fp32)", "optimizer state")
    )
    assert plan_p.actor.peak > plan_g.actor.peak + items[CRITIC_GRADS]
    # offloaded whole while the engine runs: host RAM, not the rollout phase
    assert plan_p.rollout_phase == plan_g.rollout_phase
    assert plan_p.actor_host == plan_g.actor_host + items[CRITIC_STATE]
    assert any(CRITIC_STATE in line for line in format_memory(ppo))
