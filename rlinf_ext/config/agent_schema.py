"""The experiment schema of one agent: ``ExperimentConfig`` with the agent's own dataclass (``AgentSpec.config``)
mounted at ``agentloop.<name>``. An agent without a config dataclass gets the base schema.

The agent's section is imported by its path when a config names the agent (the plug-in mechanism: an agent outside
``rlinf_ext`` brings its section the same way), so the central schema holds only what every agent shares.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from rlinf_ext.config.schema import AgentLoopConfig, ExperimentConfig, fld
from rlinf_ext.protocol.agents import AgentSpec, agent_spec


@functools.cache
def _schema_of(spec: AgentSpec) -> type:
    section = spec.load("config")
    if not (isinstance(section, type) and dataclasses.is_dataclass(section)):
        raise ValueError(f"agent {spec.name!r}: its config component {spec.config!r} is not a dataclass")
    if spec.name in {f.name for f in dataclasses.fields(AgentLoopConfig)}:
        raise ValueError(f"agent {spec.name!r}: agentloop.{spec.name} is a shared key of the agentloop section; "
                         "name the agent otherwise")
    loop = dataclasses.make_dataclass(
        AgentLoopConfig.__name__, [(spec.name, section, fld(section, f"{spec.title}'s own settings."))],
        bases=(AgentLoopConfig,))
    loop.__module__ = section.__module__
    return dataclasses.make_dataclass(
        ExperimentConfig.__name__, [("agentloop", loop, fld(loop, "Multi-turn agent."))], bases=(ExperimentConfig,))


def experiment_schema(agent: str | AgentSpec) -> type:
    """The schema class of a config whose ``agentloop.agent`` is ``agent`` (a name, an import path or a spec)."""
    spec = agent if isinstance(agent, AgentSpec) else agent_spec(agent)
    return _schema_of(spec) if spec.has("config") else ExperimentConfig


def agent_sections(spec: AgentSpec) -> list[tuple[str, type]]:
    """``[(dotted prefix, dataclass)]`` of what ``spec`` mounts (the key reference lists each agent's keys)."""
    return [(f"agentloop.{spec.name}", spec.load("config"))] if spec.has("config") else []


def agent_defaults(agent: str | AgentSpec) -> dict[str, Any]:
    """The schema defaults of ``agent``'s experiment, as a plain dict."""
    return dataclasses.asdict(experiment_schema(agent)())
