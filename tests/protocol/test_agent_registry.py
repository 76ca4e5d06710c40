"""The agent registry (``protocol/agents.py``): the schema's choices are its entries, every entry's components load,
an agent's own section is mounted at ``agentloop.<name>`` and its own rules run only when it is chosen, and an
agent named by import path resolves (or is refused with the reason)."""

from __future__ import annotations

import dataclasses
import inspect
import multiprocessing
import pickle
import typing
from concurrent.futures import ProcessPoolExecutor

import pytest

from rlinf_ext.agent.core.rollout import AgentRollout
from rlinf_ext.config import check_config
from rlinf_ext.config.agent_schema import experiment_schema
from rlinf_ext.config.schema import AgentLoopConfig, ExperimentConfig
from rlinf_ext.protocol.agents import AGENTS, AgentSpec, agent_spec


def test_schema_choices_are_the_registry():
    hints = typing.get_type_hints(AgentLoopConfig)
    literal, import_path = typing.get_args(hints["agent"])
    assert set(typing.get_args(literal)) == set(AGENTS)


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_every_component_loads(name):
    spec = agent_spec(name)
    rollout = spec.load("rollout")
    for method in ("groups", "run_group", "metrics", "records"):
        assert callable(getattr(rollout, method)), f"{spec.rollout} lacks {method} ({AgentRollout.__name__})"
    assert inspect.iscoroutinefunction(rollout.run_group)
    for component in ("dataset", "reward", "evaluation", "tiny_assets"):
        assert callable(spec.load(component)), component
    validation = spec.load("validation")  # what the trainer builds and calls
    assert callable(validation.run) and callable(validation.summary)
    assert spec.stops and all(tag.startswith("</") for tag in spec.stops)
    if spec.has("config"):
        assert dataclasses.is_dataclass(spec.load("config"))


def test_unknown_agent_is_named():
    with pytest.raises(ValueError, match="agentloop.agent='nope'.*mmsearch.*searchr1.*pkg.module:SPEC"):
        agent_spec("nope")


def test_an_agents_section_is_mounted_only_for_it():
    mm = experiment_schema("mmsearch")
    assert issubclass(mm, ExperimentConfig)
    assert mm().agentloop.mmsearch.max_gen_round == 3  # the agent's own defaults
    assert not hasattr(ExperimentConfig().agentloop, "mmsearch")
    result = check_config("tiny-cpu", ["agentloop.mmsearch.max_gen_round=2"])
    assert any(i.key == "agentloop.mmsearch" and "unknown key" in i.reason for i in result.issues)


def _echo(value):
    return value


def test_a_config_with_an_agents_section_pickles_into_a_fresh_process():
    """The per-agent classes are found by name (``config/agent_schema.py``), as spawn and checkpoints need."""
    cfg = check_config("tiny-mm-cpu", []).cfg
    assert type(cfg).__module__ == "rlinf_ext.config.agent_schema"
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        back = pool.submit(_echo, cfg).result()
    assert back == cfg and back.agentloop.mmsearch.max_gen_round == 3


def test_an_agents_own_rules_run_only_when_it_is_chosen():
    bad = check_config("tiny-mm-cpu", ["agentloop.mmsearch.image_search_limit=5"])
    assert any(i.key == "agentloop.mmsearch.image_search_limit" for i in bad.issues)
    assert check_config("tiny-cpu", []).ok  # no MMSearch-R1 rule reads the missing section


SPEC = AgentSpec(
    name="echo",
    title="Echo",
    stops=("</answer>",),
    vision=False,
    reward_scorings=("em",),
    rollout="rlinf_ext.agent.searchr1.rollout:SearchR1Rollout",
    dataset="rlinf_ext.data.prompts:build_prompt_datasets",
    reward="rlinf_ext.rewards.searchr1:searchr1_reward",
)
NOT_A_SPEC = object()


ECHO_YAML = f"""
defaults: [model/qwen2-tiny, cluster/cpu, _self_]
runner: {{experiment_name: echo, seq_length: 512}}
algorithm: {{group_size: 2, n_minibatches: 1, training_batch_size_per_gpu: 2, sampling_params: {{max_new_tokens: 64}}}}
data: {{train_data_paths: [train.jsonl], val_data_paths: [test.jsonl], max_prompt_length: 256, rollout_batch_size: 2}}
agentloop: {{agent: "{__name__}:SPEC", response_length_total: 256}}
"""


def test_an_agent_by_import_path(tmp_path):
    assert agent_spec(f"{__name__}:SPEC") is SPEC
    yaml = tmp_path / "echo.yaml"
    yaml.write_text(ECHO_YAML)
    result = check_config(yaml, ["runner.val_check_interval=1"])
    # the agent brings no validation pass: validating during training is refused, with the fix
    (issue,) = result.issues
    assert issue.key == "runner.val_check_interval" and "no validation pass" in issue.reason
    result = check_config(yaml, [])
    assert result.ok, [str(i) for i in result.issues]
    assert result.cfg.agentloop.agent == f"{__name__}:SPEC"
    # a Search-R1 YAML's own section is not this agent's: refused as an unknown key, not silently ignored
    assert any(
        i.key == "agentloop.searchr1" for i in check_config("tiny-cpu", [f"agentloop.agent={__name__}:SPEC"]).issues
    )


HYPHENATED = dataclasses.replace(SPEC, name="my-echo")
BUILT_IN_NAME = dataclasses.replace(SPEC, name="searchr1")


@pytest.mark.parametrize(
    "path, words, fix",
    [
        ("no_such_pkg.agent:SPEC", "cannot import module", "PYTHONPATH"),
        (f"{__name__}:MISSING", "has no attribute", "fix the path"),
        (
            f"{__name__}:NOT_A_SPEC",
            "not an rlinf_ext.protocol.agents.AgentSpec",
            "an AgentSpec object (pkg.module:SPEC)",
        ),
        (f"{__name__}:HYPHENATED", "'my-echo' is not a Python identifier", "AgentSpec(name='my_echo', ...)"),
        (f"{__name__}:BUILT_IN_NAME", "is a built-in agent's", "AgentSpec(name='searchr1_custom', ...)"),
    ],
)
def test_a_bad_agent_is_refused_first_with_its_own_fix(tmp_path, path, words, fix):
    yaml = tmp_path / "echo.yaml"
    yaml.write_text(
        ECHO_YAML.replace(f"{__name__}:SPEC", path).replace(
            "response_length_total: 256}", "response_length_total: 256, echo_section_of_the_agent: {}}"
        )
    )
    result = check_config(yaml, [])
    first, *knock_on = result.issues  # the cause before what follows from it
    assert first.key == "agentloop.agent" and words in first.reason and fix in first.fix, str(first)
    (section,) = [i for i in knock_on if i.key == "agentloop.echo_section_of_the_agent"]
    assert "unknown key" in section.reason and "fix agentloop.agent above" in section.fix
