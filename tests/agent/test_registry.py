"""The agent registry: the schema's choices are its entries, every entry's components load, and an agent's
other keys are checked against it in one rule."""

from __future__ import annotations

import inspect
import typing

import pytest

from rlinf_ext.agent.core.rollout import AgentRollout
from rlinf_ext.agent.registry import AGENTS, agent_spec
from rlinf_ext.config import check_config
from rlinf_ext.config.schema import AgentLoopConfig, DataConfig, RewardConfig


def test_schema_choices_are_the_registry():
    hints = typing.get_type_hints(AgentLoopConfig)
    assert set(typing.get_args(hints["agent"])) == set(AGENTS)
    assert {s.data_type for s in AGENTS.values()} == set(typing.get_args(typing.get_type_hints(DataConfig)["type"]))
    assert ({s.reward_type for s in AGENTS.values()}
            == set(typing.get_args(typing.get_type_hints(RewardConfig)["reward_type"])))


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_every_component_loads(name):
    spec = agent_spec(name)
    rollout = spec.load("rollout")
    for method in ("groups", "run_group", "metrics", "records"):
        assert callable(getattr(rollout, method)), f"{spec.rollout} lacks {method} ({AgentRollout.__name__})"
    assert inspect.iscoroutinefunction(rollout.run_group)
    assert callable(spec.load("evaluation"))
    validation = spec.load("validation")  # what the trainer builds and calls
    assert callable(validation.run) and callable(validation.summary)
    assert spec.stops and all(tag.startswith("</") for tag in spec.stops)


def test_unknown_agent_is_named():
    with pytest.raises(ValueError, match="agentloop.agent='nope'.*mmsearch.*searchr1"):
        agent_spec("nope")


@pytest.mark.parametrize("config, key, value", [
    ("tiny-mm-cpu", "data.type", "searchr1"),
    ("tiny-mm-cpu", "reward.reward_type", "searchr1"),
    ("tiny-cpu", "data.type", "mmsearch"),
])
def test_an_agents_keys_are_checked_against_its_entry(config, key, value):
    result = check_config(config, [f"{key}={value}"])
    assert not result.ok
    issue = next(i for i in result.issues if i.key == key)
    assert "agentloop.agent=" in issue.reason and f"{key}=" in issue.fix


def test_agent_needs_its_model_kind():
    result = check_config("tiny-cpu", ["agentloop.agent=mmsearch", "data.type=mmsearch", "reward.reward_type=mmsearch",
                                       "reward.scoring=em"])
    assert any(i.key == "rollout.model.model_type" and "vision-language" in i.reason for i in result.issues)
