"""Tools by name: a registered short name (``search``) or an import path ``pkg.module:Class`` naming a ``Tool``
subclass anywhere on the Python path, so a tool can live outside ``rlinf_ext/``.

``build_tools`` is the one way tools are built (the agent-loop worker's rollouts, evaluation, validation);
``check_tool_names`` says what is wrong with a configured list without building anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlinf_ext.protocol.agents import agent_tools
from rlinf_ext.protocol.plugins import is_import_path, load_path
from rlinf_ext.tools.base import Tool, ToolContext

# short name -> import path; modules are imported only when a tool is resolved
SEARCH = "search"
BUILTIN_TOOLS: dict[str, str] = {
    SEARCH: "rlinf_ext.tools.search:TextSearch",
}
# tags the Search-R1 protocol uses itself: a tool named after one would be read as that block
RESERVED_TAGS = ("answer", "think", "information")


class ToolNameError(ValueError):
    """A configured tool name that resolves to no ``Tool`` subclass."""


def resolve_tool(name: str) -> type[Tool]:
    """The ``Tool`` subclass a configured name stands for; ToolNameError naming the choices otherwise."""
    path = BUILTIN_TOOLS.get(name, name)
    if not is_import_path(path):
        raise ToolNameError(
            f"tool {name!r} is neither a registered tool ({sorted(BUILTIN_TOOLS)}) nor an import path "
            "'pkg.module:Class' (e.g. 'mypkg.tools:Calculator')"
        )
    try:
        cls = load_path(path, f"tool {name!r}")
    except ValueError as exc:
        raise ToolNameError(str(exc)) from None
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise ToolNameError(f"tool {name!r}: {path} is {cls!r}, not a subclass of rlinf_ext.tools.base.Tool")
    if not cls.name:
        raise ToolNameError(f"tool {name!r}: {path} sets no `name`")
    return cls


def check_tool_names(names: Sequence[str]) -> list[str]:
    """Every problem of a configured tool list (empty when each name resolves, and no two tools share a name or
    tag, and no tag is one of the protocol's own)."""
    problems: list[str] = []
    seen_names: dict[str, str] = {}
    seen_tags: dict[str, str] = {}
    for name in names:
        try:
            cls = resolve_tool(str(name))
        except ToolNameError as exc:
            problems.append(str(exc))
            continue
        tag = cls.tag_name()
        if tag in RESERVED_TAGS:
            problems.append(f"tool {name!r} uses the tag <{tag}>, which the protocol itself uses "
                            f"({', '.join(f'<{t}>' for t in RESERVED_TAGS)}); give it another tag")
        if cls.name in seen_names:
            problems.append(f"tools {seen_names[cls.name]!r} and {name!r} share the name {cls.name!r}")
        if tag in seen_tags:
            problems.append(f"tools {seen_tags[tag]!r} and {name!r} share the tag <{tag}>")
        seen_names.setdefault(cls.name, str(name))
        seen_tags.setdefault(tag, str(name))
    return problems


def tool_classes(names: Sequence[str]) -> list[type[Tool]]:
    """The classes of a configured list, checked (ValueError listing every problem)."""
    problems = check_tool_names(names)
    if problems:
        raise ToolNameError("; ".join(problems))
    return [resolve_tool(str(name)) for name in names]


def build_tools(names: Sequence[str], cfg: Any, context: ToolContext | None = None) -> list[Tool]:
    """The tools of a configured list, each built from the experiment config ``cfg`` and ``context``."""
    context = context if context is not None else ToolContext(seed=int(cfg.runner.seed))
    return [cls.from_config(cfg, context) for cls in tool_classes(names)]


def tool_tags(names: Sequence[str]) -> list[str]:
    """The action tag names of a configured list (what the format reward accepts after a thought)."""
    return [cls.tag_name() for cls in tool_classes(names)]


def build_agent_tools(cfg: Any, context: ToolContext | None = None) -> list[Tool]:
    """The tools the chosen agent calls (``protocol/agents.py:agent_tools``), built: the one way the agent-loop
    worker's rollouts, evaluation and validation get them."""
    return build_tools(agent_tools(cfg), cfg, context)
