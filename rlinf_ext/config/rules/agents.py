"""Rules every agent shares, read from its registry entry (``protocol/agents.py``): its model kind and reward
scorings, its stop strings, its validation pass. An agent's own rules live with it (``AgentSpec.rules``)."""

from __future__ import annotations

from rlinf_ext.config.rule_registry import rule
from rlinf_ext.config.structure import ConfigIssue
from rlinf_ext.protocol.agents import agent_spec
from rlinf_ext.tools.registry import ToolNameError, agent_stops


@rule("agentloop.agent", "reward.scoring", "rollout.model.model_type")
def agent_reward_and_model_fit(cfg):
    """An agent is one choice (agentloop.agent); its data reader and reward follow from it, and it names the
    scorings its reward accepts and the kind of model it runs on."""
    spec = agent_spec(cfg)
    if cfg.reward.scoring not in spec.reward_scorings:
        yield ConfigIssue(
            "reward.scoring",
            f"the {spec.title} reward scores {list(spec.reward_scorings)}, got {cfg.reward.scoring}.",
            f"set reward.scoring to one of {list(spec.reward_scorings)}.",
        )
    vl = cfg.rollout.model.model_type == "qwen2.5_vl"
    if spec.vision != vl:
        need = "a vision-language model (qwen2.5_vl)" if spec.vision else "a text model"
        yield ConfigIssue(
            "rollout.model.model_type",
            f"{spec.title} runs on {need}, but rollout.model.model_type={cfg.rollout.model.model_type}.",
            "use a model of the agent's kind, or choose the other agent.",
        )


@rule("agentloop.agent", "algorithm.sampling_params.stop")
def stops_hold_the_action_tags(cfg):
    """The loop acts when the engine stops at an action's closing tag. Every request carries the agent's stops
    (the loop adds them), so a configured list that leaves one out runs anyway: a warning, since the list then
    says something the run does not do (often a tool added without its tag)."""
    spec = agent_spec(cfg)
    configured = cfg.algorithm.sampling_params.stop or []
    try:
        stops = agent_stops(cfg)
    except ToolNameError:  # a tool that does not resolve is reported by the tools' own rule
        return
    missing = [t for t in stops if t not in configured]
    if configured and missing:
        yield ConfigIssue(
            "algorithm.sampling_params.stop",
            f"{spec.title} turns with these tools end at {list(stops)}; missing {missing}.",
            f"add {missing} to algorithm.sampling_params.stop, or leave it empty (the loop adds its stops).",
            warning=True,
        )


@rule("agentloop.agent", "runner.val_before_train", "runner.val_check_interval", "data.val_data_paths")
def validation_needs_the_agents_pass(cfg):
    """Validation during training runs the agent's own pass (``AgentSpec.validation``); an agent may bring none."""
    spec = agent_spec(cfg)
    runner = cfg.runner
    wanted = (runner.val_before_train or runner.val_check_interval > 0) and bool(cfg.data.val_data_paths)
    if wanted and not spec.has("validation"):
        yield ConfigIssue(
            "runner.val_check_interval",
            f"agent {spec.name} ({spec.title}) brings no validation pass "
            "(AgentSpec.validation), so nothing can validate during training.",
            "set runner.val_before_train=false and runner.val_check_interval=0, or give the agent a "
            "validation component.",
        )
