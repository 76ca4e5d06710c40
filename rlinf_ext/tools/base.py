"""What a tool is: a name, its tags, its stop strings, its line of the invalid-action text, its call and its metrics.

An agent loop holds a list of tools and derives everything tool-specific from it (the action parser, the engine's
stop strings, the invalid-action text, the format reward's tags, the per-trajectory counters). A tool is built by
``tools/registry.py:build_tools`` from the experiment config and a ``ToolContext`` (what only the worker knows).
A minimal tool::

    class Echo(Tool):
        name = "echo"
        instruction = "If I want an echo, I should put the text between <echo> and </echo>."

        async def __call__(self, content: str) -> ToolOutput:
            return ToolOutput(body=content)

A tool with settings names a dataclass as ``config_class``; its keys are ``tools.<name>.*`` in the YAML, typed and
refused by key like the central schema's (``config/agent_schema.py`` mounts the section of each configured tool), and
``from_config`` reads them with ``cls.settings(cfg)``. Range checks go in the dataclass's ``problems()``, which yields
``SettingProblem``s: ``validate`` reports them by key.

Kept free of heavy imports: config checks and the reward read tool classes without starting anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlinf_ext.tools.ledger import charge_tool_seconds, tool_call


@dataclass
class ToolOutput:
    """One call's result: ``body`` is the text shown to the model (the loop wraps it in its observation tags),
    ``images`` what its image placeholders stand for. ``latency_s`` None: the caller times the call itself."""

    body: str
    ok: bool = True
    latency_s: float | None = None
    error: str | None = None
    images: list[Any] = field(default_factory=list)  # images the body shows (ImageRef), in order; text tools: none


@dataclass(frozen=True)
class ToolContext:
    """What a tool may need beyond the experiment config, known only where it is built (the agent-loop worker,
    evaluation): a seed, the node it runs on, the launcher's node, a retrieval-server address started for the run."""

    seed: int = 0
    node_ip: str | None = None
    launcher_ip: str | None = None
    search_server_addr: Any = None


@dataclass(frozen=True)
class ToolMetricNames:
    """Keys of a trajectory's ``metrics`` the loop fills for one tool (means over trajectories are logged as
    ``agent/<key>``)."""

    calls: str
    failures: str
    latency_s: str
    failure_rate: str  # failures / calls over a step's trajectories (a step metric, not a trajectory's)


@dataclass(frozen=True)
class SettingProblem:
    """A value of a tool's settings it cannot work with: the field's name in its section, what is wrong, the fix."""

    key: str
    problem: str
    fix: str


def setting_problems(settings: Any) -> list[SettingProblem]:
    """What the settings' own ``problems()`` finds (none when the dataclass defines no check)."""
    check = getattr(settings, "problems", None)
    return list(check()) if callable(check) else []


def refuse_setting_problems(settings: Any, section: str) -> None:
    """ValueError naming each bad key of ``section`` (``tools.<name>``) and its fix: for a client built in code,
    without ``validate`` (which reports the same problems)."""
    problems = setting_problems(settings)
    if problems:
        raise ValueError("; ".join(f"{section}.{p.key}: {p.problem} Fix: {p.fix}" for p in problems))


@dataclass
class ToolStats:
    """Calls made through ``Tool.run`` over the tool's life (each request's share: ``tools/ledger.py``)."""

    calls: int = 0
    failures: int = 0
    latencies_s: list[float] = field(default_factory=list)


class Tool:
    """Base class of a tool. A subclass sets ``name`` and ``instruction`` (and ``tag`` when it differs from the
    name) and implements ``async __call__(content) -> ToolOutput``; ``from_config`` builds it (default: no
    arguments). A ``config_class`` (a dataclass) declares its settings, ``tools.<name>.*``. Loops call ``run``
    (timed, counted)."""

    name: ClassVar[str] = ""
    tag: ClassVar[str] = ""  # the action tag's name (<tag>…</tag>); "" = the tool's name
    instruction: ClassVar[str] = ""  # its sentence in the invalid-action text; "" = a generic one
    metric_names_override: ClassVar[ToolMetricNames | None] = None  # None = <name>_calls, <name>_failures, ...
    config_class: ClassVar[type | None] = None  # a dataclass: the section tools.<name> (None = no settings)

    @classmethod
    def from_config(cls, cfg: Any, context: ToolContext) -> "Tool":
        """The tool for an experiment config (``cfg``: the whole ``ExperimentConfig``; ``cls.settings(cfg)``: its own
        section)."""
        return cls()

    @classmethod
    def settings(cls, cfg: Any) -> Any:
        """This tool's typed section of ``cfg`` (``tools.<name>``); its defaults when ``cfg`` was made without it
        (in code, not by the loader), as any key left out of a config keeps its default."""
        if cls.config_class is None:
            raise TypeError(
                f"tool {cls.name!r} declares no settings: set config_class = <a dataclass> on "
                f"{cls.__name__} to read tools.{cls.name}.*"
            )
        section = getattr(getattr(cfg, "tools", None), cls.name, None)
        return section if section is not None else cls.config_class()

    async def __call__(self, content: str) -> ToolOutput:
        raise NotImplementedError(f"{type(self).__name__} must implement async __call__(content) -> ToolOutput")

    # --- derived from the class attributes; subclasses rarely override these ---

    @classmethod
    def tag_name(cls) -> str:
        return cls.tag or cls.name

    @classmethod
    def open_tag(cls) -> str:
        return f"<{cls.tag_name()}>"

    @classmethod
    def close_tag(cls) -> str:
        return f"</{cls.tag_name()}>"

    @classmethod
    def stops(cls) -> tuple[str, ...]:
        """The strings the engine must stop at for the loop to act on a call (its closing tag)."""
        return (cls.close_tag(),)

    @classmethod
    def invalid_action_line(cls) -> str:
        return cls.instruction or (
            f"If I want to use the {cls.name} tool, I should put its input between {cls.open_tag()} and "
            f"{cls.close_tag()}."
        )

    @classmethod
    def metric_names(cls) -> ToolMetricNames:
        return cls.metric_names_override or ToolMetricNames(
            calls=f"{cls.name}_calls",
            failures=f"{cls.name}_failures",
            latency_s=f"{cls.name}_latency_s",
            failure_rate=f"{cls.name}_failure_rate",
        )

    @property
    def stats(self) -> ToolStats:
        stats = self.__dict__.get("_tool_stats")
        if stats is None:
            stats = self.__dict__["_tool_stats"] = ToolStats()
        return stats

    async def run(self, content: str) -> ToolOutput:
        """``self(content)``, timed when the tool does not report its latency, counted in ``stats`` and charged to
        the request that made it (``tools/ledger.py``; the worker logs each request's sum as ``time/tool``)."""
        started = time.monotonic()
        with tool_call() as call:
            output = await self(content)
        if output.latency_s is None:
            output.latency_s = time.monotonic() - started
        self.stats.calls += 1
        self.stats.failures += 0 if output.ok else 1
        self.stats.latencies_s.append(float(output.latency_s))
        if not call.charged:  # a client under it (TextSearch's SearchTool) charged the call already
            charge_tool_seconds(output.latency_s)
        return output
