"""The experiment schema of one agent: ``ExperimentConfig`` with the agent's own dataclass (``AgentSpec.config``)
mounted at ``agentloop.<name>``. An agent without a config dataclass gets the base schema.

The agent's section is imported by its path when a config names the agent (the plug-in mechanism: an agent outside
``rlinf_ext`` brings its section the same way), so the central schema holds only what every agent shares.

The two classes made per agent are attributes of this module by name (``ExperimentConfig__<agent>``,
``AgentLoopConfig__<agent>``; the module's ``__getattr__`` makes them on demand), so a config pickles by reference
and unpickles in a fresh process (multiprocessing's spawn, a checkpoint), as the base schema does.
"""

from __future__ import annotations

import dataclasses
import functools

from rlinf_ext.config.schema import AgentLoopConfig, ExperimentConfig, fld
from rlinf_ext.protocol.agents import AgentSpec, agent_spec

_EXPERIMENT, _LOOP = "ExperimentConfig__", "AgentLoopConfig__"
_BY_NAME, _BY_HEX = "n_", "h_"  # an agent that is a Python identifier by name, an import path by its hex


def _suffix(agent: str) -> str:
    return _BY_NAME + agent if agent.isidentifier() else _BY_HEX + agent.encode().hex()


def _agent_of(suffix: str) -> str:
    if suffix.startswith(_BY_NAME):
        return suffix[len(_BY_NAME):]
    if suffix.startswith(_BY_HEX):
        return bytes.fromhex(suffix[len(_BY_HEX):]).decode()
    raise ValueError(suffix)


def _named(cls: type, name: str) -> type:
    cls.__name__ = cls.__qualname__ = name
    cls.__module__ = __name__
    return cls


@functools.cache
def _schema_of(agent: str) -> type:
    spec = agent_spec(agent)
    section = spec.load("config")
    if not (isinstance(section, type) and dataclasses.is_dataclass(section)):
        raise ValueError(f"agent {spec.name!r}: its config component {spec.config!r} is not a dataclass")
    if spec.name in {f.name for f in dataclasses.fields(AgentLoopConfig)}:
        raise ValueError(f"agent {spec.name!r}: agentloop.{spec.name} is a shared key of the agentloop section; "
                         "name the agent otherwise")
    loop = _named(dataclasses.make_dataclass(
        _LOOP + _suffix(agent), [(spec.name, section, fld(section, f"{spec.title}'s own settings."))],
        bases=(AgentLoopConfig,)), _LOOP + _suffix(agent))
    return _named(dataclasses.make_dataclass(
        _EXPERIMENT + _suffix(agent), [("agentloop", loop, fld(loop, "Multi-turn agent."))],
        bases=(ExperimentConfig,)), _EXPERIMENT + _suffix(agent))


def __getattr__(name: str) -> type:
    """The classes made for an agent, by their names (what pickle looks up)."""
    for prefix in (_EXPERIMENT, _LOOP):
        if name.startswith(prefix):
            try:
                experiment = _schema_of(_agent_of(name[len(prefix):]))
            except ValueError:
                break
            if prefix == _EXPERIMENT:
                return experiment
            return next(f.default_factory for f in dataclasses.fields(experiment) if f.name == "agentloop")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def experiment_schema(agent: str | AgentSpec) -> type:
    """The schema class of a config whose ``agentloop.agent`` is ``agent`` (a registered name, an import path, or
    a registered agent's spec)."""
    name = agent.name if isinstance(agent, AgentSpec) else agent
    return _schema_of(name) if agent_spec(name).has("config") else ExperimentConfig


def agent_sections(spec: AgentSpec) -> list[tuple[str, type]]:
    """``[(dotted prefix, dataclass)]`` of what ``spec`` mounts (the key reference lists each agent's keys)."""
    return [(f"agentloop.{spec.name}", spec.load("config"))] if spec.has("config") else []
