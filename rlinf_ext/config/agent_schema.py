"""The experiment schema of one agent and its tools: ``ExperimentConfig`` with the agent's own dataclass
(``AgentSpec.config``) mounted at ``agentloop.<name>`` and each tool's (``Tool.config_class``) at ``tools.<its name>``
(the built-in tools' always, so shared defaults files may set them; a configured tool's when it has one).

The sections are imported by their paths when a config names the agent and its tools (the plug-in mechanism: an agent
or a tool outside ``rlinf_ext`` brings its section the same way), so the central schema holds only what every agent
shares.

The classes made per agent and tool list are attributes of this module by name (``ExperimentConfig__<key>``,
``AgentLoopConfig__<key>``, ``ToolsConfig__<key>``; the module's ``__getattr__`` makes them on demand), so a config
pickles by reference and unpickles in a fresh process (multiprocessing's spawn, a Ray worker), as the base schema
does.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from rlinf_ext.config.schema import AgentLoopConfig, ExperimentConfig, ToolsConfig, fld
from rlinf_ext.protocol.agents import AgentSpec, agent_spec
from rlinf_ext.tools.registry import BUILTIN_TOOLS, settings_sections

_EXPERIMENT, _LOOP, _TOOLS = "ExperimentConfig__", "AgentLoopConfig__", "ToolsConfig__"
_BY_NAME, _BY_HEX = "n_", "h_"  # a key that is a Python identifier by name, else by its hex
_TOOL_LIST = "|"  # agent|tool,tool: the configured tools that are not built in (those are always mounted)


def _key(agent: str, tools: tuple[str, ...]) -> str:
    return agent + (_TOOL_LIST + ",".join(tools) if tools else "")


def _suffix(key: str) -> str:
    return _BY_NAME + key if key.isidentifier() else _BY_HEX + key.encode().hex()


def _key_of(suffix: str) -> tuple[str, tuple[str, ...]]:
    if suffix.startswith(_BY_NAME):
        key = suffix[len(_BY_NAME) :]
    elif suffix.startswith(_BY_HEX):
        key = bytes.fromhex(suffix[len(_BY_HEX) :]).decode()
    else:
        raise ValueError(suffix)
    agent, _, tools = key.partition(_TOOL_LIST)
    return agent, tuple(tools.split(",")) if tools else ()


def _named(cls: type, name: str) -> type:
    cls.__name__ = cls.__qualname__ = name
    cls.__module__ = __name__
    return cls


def _loop_section(agent: str, suffix: str) -> list[tuple[str, type, dataclasses.Field]]:
    """The ``agentloop`` field with the agent's own section mounted ([] for no agent or one without a section)."""
    if not agent or not agent_spec(agent).has("config"):
        return []
    spec = agent_spec(agent)
    section = spec.load("config")
    if not (isinstance(section, type) and dataclasses.is_dataclass(section)):
        raise ValueError(f"agent {spec.name!r}: its config component {spec.config!r} is not a dataclass")
    if spec.name in {f.name for f in dataclasses.fields(AgentLoopConfig)}:
        raise ValueError(
            f"agent {spec.name!r}: agentloop.{spec.name} is a shared key of the agentloop section; "
            "name the agent otherwise"
        )
    loop = _named(
        dataclasses.make_dataclass(
            _LOOP + suffix,
            [(spec.name, section, fld(section, f"{spec.title}'s own settings."))],
            bases=(AgentLoopConfig,),
        ),
        _LOOP + suffix,
    )
    return [("agentloop", loop, fld(loop, "Multi-turn agent."))]


@functools.cache
def _schema_of(agent: str, tools: tuple[str, ...]) -> type:
    suffix = _suffix(_key(agent, tools))
    sections = [
        (name, cls, fld(cls, f"The {name} tool's settings (its config_class)."))
        for name, cls in settings_sections(tools).items()
    ]
    tools_section = _named(dataclasses.make_dataclass(_TOOLS + suffix, sections, bases=(ToolsConfig,)), _TOOLS + suffix)
    return _named(
        dataclasses.make_dataclass(
            _EXPERIMENT + suffix,
            [*_loop_section(agent, suffix), ("tools", tools_section, fld(tools_section, "Tools."))],
            bases=(ExperimentConfig,),
        ),
        _EXPERIMENT + suffix,
    )


def __getattr__(name: str) -> type:
    """The classes made for an agent and its tools, by their names (what pickle looks up)."""
    for prefix, section in ((_EXPERIMENT, None), (_LOOP, "agentloop"), (_TOOLS, "tools")):
        if name.startswith(prefix):
            try:
                experiment = _schema_of(*_key_of(name[len(prefix) :]))
            except ValueError:
                break
            if section is None:
                return experiment
            return next(f.default_factory for f in dataclasses.fields(experiment) if f.name == section)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def experiment_schema(agent: str | AgentSpec | None, tools: Sequence[str] = ()) -> type:
    """The schema class of a config whose ``agentloop.agent`` is ``agent`` (a registered name, an import path, a
    registered agent's spec, or None when it names no usable agent) and whose agent calls ``tools`` (registered
    names or import paths)."""
    name = agent.name if isinstance(agent, AgentSpec) else agent or ""
    return _schema_of(name, tuple(str(t) for t in tools if str(t) not in BUILTIN_TOOLS))


def agent_sections(spec: AgentSpec) -> list[tuple[str, type]]:
    """``[(dotted prefix, dataclass)]`` of what ``spec`` mounts (the key reference lists each agent's keys)."""
    return [(f"agentloop.{spec.name}", spec.load("config"))] if spec.has("config") else []


def builtin_tool_sections() -> list[tuple[str, type]]:
    """``[(dotted prefix, dataclass)]`` of the built-in tools' settings (the key reference lists their keys)."""
    return [(f"tools.{name}", cls) for name, cls in settings_sections(()).items()]
