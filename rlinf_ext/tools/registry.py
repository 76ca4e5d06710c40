"""Tools by name: a registered short name (``search``) or an import path ``pkg.module:Class`` naming a ``Tool``
subclass anywhere on the Python path, so a tool can live outside ``rlinf_ext/``.

``build_tools`` is the one way tools are built (the agent-loop worker's rollouts, evaluation, validation);
``check_tool_names`` says what is wrong with a configured list without building anything; ``settings_sections``
gives the ``tools.<name>`` sections the config loader mounts.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlinf_ext.protocol.agents import agent_spec, agent_tools
from rlinf_ext.protocol.plugins import is_import_path, load_path
from rlinf_ext.tools.base import Tool, ToolContext

# short name -> import path; modules are imported only when a tool is resolved
SEARCH, IMAGE_SEARCH = "search", "image_search"
BUILTIN_TOOLS: dict[str, str] = {
    SEARCH: "rlinf_ext.tools.search:TextSearch",
    IMAGE_SEARCH: "rlinf_ext.tools.image_search:ImageSearch",
}
# tags the Search-R1 protocol uses itself: a tool named after one would be read as that block
RESERVED_TAGS = ("answer", "think", "information")


class ToolNameError(ValueError):
    """A configured tool name that resolves to no usable ``Tool`` subclass: the problem and its own ``fix``."""

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(problem)
        self.problem, self.fix = problem, fix


@dataclass(frozen=True)
class ToolProblem:
    """One problem of a configured tool list, with the fix for that problem."""

    problem: str
    fix: str

    def __str__(self) -> str:
        return self.problem


def resolve_tool(name: str) -> type[Tool]:
    """The ``Tool`` subclass a configured name stands for; ToolNameError with the problem and its fix otherwise."""
    path = BUILTIN_TOOLS.get(name, name)
    if not is_import_path(path):
        raise ToolNameError(
            f"tool {name!r} is neither a registered tool ({sorted(BUILTIN_TOOLS)}) nor an import path "
            "'pkg.module:Class' (e.g. 'mypkg.tools:Calculator')",
            f"use one of {sorted(BUILTIN_TOOLS)} or the import path of a Tool subclass (docs/extending.md).",
        )
    try:
        cls = load_path(path, f"tool {name!r}")
    except ValueError as exc:
        raise ToolNameError(str(exc), "fix the path, or put the package that defines it on PYTHONPATH.") from None
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise ToolNameError(
            f"tool {name!r}: {path} is {cls!r}, not a subclass of rlinf_ext.tools.base.Tool",
            "derive the class from rlinf_ext.tools.base.Tool.",
        )
    if not cls.name:
        raise ToolNameError(
            f"tool {name!r}: {path} sets no `name`",
            "set the class attribute name = '...' (its metrics' prefix, and its tag unless tag is set).",
        )
    if cls.__call__ is Tool.__call__:
        raise ToolNameError(
            f"tool {name!r}: {path} does not implement __call__, so every call would fail",
            f"define `async def __call__(self, content: str) -> ToolOutput` on {cls.__name__}.",
        )
    if not inspect.iscoroutinefunction(cls.__call__):
        raise ToolNameError(
            f"tool {name!r}: {path}'s __call__ is not a coroutine function (the loops await it)",
            "make it `async def __call__(self, content: str) -> ToolOutput`.",
        )
    if cls.config_class is not None and not (
        isinstance(cls.config_class, type) and dataclasses.is_dataclass(cls.config_class)
    ):
        raise ToolNameError(
            f"tool {name!r}: {path}'s config_class is {cls.config_class!r}, not a dataclass",
            f"set config_class on {cls.__name__} to a @dataclass of its settings (tools.{cls.name}.*), or to None.",
        )
    if cls.config_class is not None and not cls.name.isidentifier():  # it names the section tools.<name>
        raise ToolNameError(
            f"tool {name!r}: its name {cls.name!r} is not a Python identifier, and it names its "
            f"settings' section tools.<name>",
            "use letters, digits and underscores in `name`.",
        )
    return cls


def check_tool_names(names: Sequence[str]) -> list[ToolProblem]:
    """Every problem of a configured tool list, each with its fix (empty when each name resolves, and no two tools
    share a name or tag, and no tag is one of the protocol's own)."""
    problems: list[ToolProblem] = []
    seen_names: dict[str, str] = {}
    seen_tags: dict[str, str] = {}
    for name in names:
        try:
            cls = resolve_tool(str(name))
        except ToolNameError as exc:
            problems.append(ToolProblem(exc.problem, exc.fix))
            continue
        tag = cls.tag_name()
        if tag in RESERVED_TAGS:
            problems.append(
                ToolProblem(
                    f"tool {name!r} uses the tag <{tag}>, which the protocol itself uses "
                    f"({', '.join(f'<{t}>' for t in RESERVED_TAGS)}); give it another tag",
                    f"set the class attribute tag = '...' on {cls.__name__} to another name.",
                )
            )
        if cls.name in seen_names:
            problems.append(
                ToolProblem(
                    f"tools {seen_names[cls.name]!r} and {name!r} share the name {cls.name!r}",
                    "give one of them another name (or list it once).",
                )
            )
        if tag in seen_tags:
            problems.append(
                ToolProblem(
                    f"tools {seen_tags[tag]!r} and {name!r} share the tag <{tag}>", "give one of them another tag."
                )
            )
        seen_names.setdefault(cls.name, str(name))
        seen_tags.setdefault(tag, str(name))
    return problems


def settings_sections(names: Sequence[str]) -> dict[str, type]:
    """``{tool name: config_class}``: the sections ``tools.<name>`` of the built-in tools (always there, so that
    shared defaults files may set them) and of the configured tools that resolve (``check_tool_names`` reports the
    others)."""
    sections: dict[str, type] = {}
    for name in [*BUILTIN_TOOLS, *names]:
        try:
            cls = resolve_tool(str(name))
        except ToolNameError:
            continue
        if cls.config_class is not None:
            sections.setdefault(cls.name, cls.config_class)
    return sections


def tool_classes(names: Sequence[str]) -> list[type[Tool]]:
    """The classes of a configured list, checked (ValueError listing every problem)."""
    problems = check_tool_names(names)
    if problems:
        raise ToolNameError("; ".join(p.problem for p in problems), "; ".join(p.fix for p in problems))
    return [resolve_tool(str(name)) for name in names]


def build_tools(names: Sequence[str], cfg: Any, context: ToolContext | None = None) -> list[Tool]:
    """The tools of a configured list, each built from the experiment config ``cfg`` and ``context``."""
    context = context if context is not None else ToolContext(seed=int(cfg.runner.seed))
    return [cls.from_config(cfg, context) for cls in tool_classes(names)]


def agent_stops(cfg: Any) -> tuple[str, ...]:
    """The closing tags a turn of the configured agent must stop at: each configured tool's, then the agent's own
    (``AgentSpec.stops``: ``</answer>``, ...), so the list follows the tools."""
    spec, out = agent_spec(cfg), []
    for cls in tool_classes(agent_tools(cfg)) if spec.stops_from_tools else ():
        out += [s for s in cls.stops() if s not in out]
    return tuple(out + [s for s in spec.stops if s not in out])


def tool_tags(names: Sequence[str]) -> list[str]:
    """The action tag names of a configured list (what the format reward accepts after a thought)."""
    return [cls.tag_name() for cls in tool_classes(names)]


def build_agent_tools(cfg: Any, context: ToolContext | None = None) -> list[Tool]:
    """The tools the chosen agent calls (``protocol/agents.py:agent_tools``), built: the one way the agent-loop
    worker's rollouts, evaluation and validation get them."""
    return build_tools(agent_tools(cfg), cfg, context)
