"""Public entry points: compose + check an experiment, get the typed config and RLinf's DictConfig."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable

from omegaconf import DictConfig, OmegaConf

from rlinf_ext.config.agent_schema import experiment_schema
from rlinf_ext.config.compat import with_compat_keys
from rlinf_ext.config.compose import ComposeError, compose_traced
from rlinf_ext.config.rules import run_rules
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue, build, check_structure
from rlinf_ext.protocol.agents import AGENTS, agent_spec, agent_tools
from rlinf_ext.protocol.plugins import is_import_path
from rlinf_ext.tools.registry import BUILTIN_TOOLS, ToolNameError, resolve_tool


class ConfigError(ValueError):
    """An experiment config has problems; `issues` lists all of them."""

    def __init__(self, source: str, issues: list[ConfigIssue]):
        self.source, self.issues = source, issues
        lines = [f"{source}: {len(issues)} problem(s) in the experiment config"]
        lines += [f"  - {issue}" for issue in issues]
        super().__init__("\n".join(lines))


@dataclass
class CheckedConfig:
    """A composed config with everything found wrong with it."""

    cfg: ExperimentConfig | None  # None when the YAML could not be composed at all
    issues: list[ConfigIssue] = field(default_factory=list)
    invalid_keys: set[str] = field(default_factory=set)
    warnings: list[ConfigIssue] = field(default_factory=list)  # accepted, likely a mistake (``ConfigIssue.warning``)

    @property
    def ok(self) -> bool:
        return not self.issues


def check_config(name_or_path: str | Path, overrides: Iterable[str] = (), check_paths: bool = False) -> CheckedConfig:
    """Compose, check structure and rules; never raises for a bad config (issues are returned)."""
    try:
        raw, origins = compose_traced(name_or_path, overrides)
    except ComposeError as exc:
        return CheckedConfig(None, [ConfigIssue(e.key, e.reason, e.fix) for e in exc.all])
    schema, agent_issues, tools = _schema_of(raw)
    issues, values, bad = check_structure(raw, schema)
    # a key may come from a shared layer the experiment composes: say which file to edit
    issues = [
        dataclasses.replace(i, reason=f"{i.reason} (set in {origins[i.key]})") if i.key in origins else i
        for i in issues
    ]
    if agent_issues:  # the cause first; the agent's own section is unknown only because the agent is
        issues = agent_issues + [
            dataclasses.replace(
                i, fix=f"none of its own: fix {AGENT_KEY} above (its section is known once the agent resolves)."
            )
            if i.key.startswith("agentloop.") and i.key != AGENT_KEY
            else i
            for i in issues
        ]
    else:
        issues = [_tool_section_issue(i, raw.agentloop.agent, tools) if _is_tool_section(i) else i for i in issues]
    bad |= {AGENT_KEY} if agent_issues else set()
    cfg = build(schema, values)
    found = run_rules(cfg, skip=bad, check_paths=check_paths)
    issues += [i for i in found if not i.warning]
    return CheckedConfig(cfg, issues, bad, [i for i in found if i.warning])


AGENT_KEY = "agentloop.agent"


def _schema_of(raw: DictConfig) -> tuple[type, list[ConfigIssue], list[str]]:
    """The schema of the agent a composed config names and of the tools it calls (their sections mounted), or the
    schema without an agent and the reason the agent could not be resolved; and the configured tools."""
    try:
        name = raw.agentloop.agent
    except Exception:  # noqa: BLE001 - an unresolvable value is reported by the structure check at its key
        return experiment_schema(None), [], []
    if not isinstance(name, str) or (name not in AGENTS and not is_import_path(name)):
        return experiment_schema(None), [], []  # the structure check names the choices
    try:
        tools = _configured_tools(raw, experiment_schema(name))
        return experiment_schema(name, tools), [], tools
    except ValueError as exc:  # AgentError carries its own fix
        return (
            experiment_schema(None),
            [
                ConfigIssue(
                    AGENT_KEY,
                    getattr(exc, "problem", str(exc)),
                    getattr(exc, "fix", None)
                    or (
                        f"give {AGENT_KEY} one of {sorted(AGENTS)} or the import path of an AgentSpec "
                        "importable here (pkg.module:SPEC)."
                    ),
                )
            ],
            [],
        )


def _configured_tools(raw: DictConfig, schema: type) -> list[str]:
    """The tools the agent calls (``agent_tools`` of the typed ``agentloop`` section; a bad list is reported by the
    structure check and the rules)."""
    node = raw._get_node("agentloop")
    if not isinstance(node, DictConfig):
        return []
    loop = next(f.default_factory for f in dataclasses.fields(schema) if f.name == "agentloop")
    return agent_tools(SimpleNamespace(agentloop=build(loop, check_structure(node, loop, "agentloop.")[1])))


def _is_tool_section(issue: ConfigIssue) -> bool:
    return issue.key.startswith("tools.") and issue.key.count(".") == 1 and issue.reason.startswith("unknown key")


def _tool_section_issue(issue: ConfigIssue, agent: str, tools: list[str]) -> ConfigIssue:
    """``tools.<x>`` the schema lacks: say which tools are configured, and how to give ``x`` its settings."""
    section, listed = issue.key.split(".")[1], f"agentloop.{agent_spec(agent).name}.tools"
    classes = {cls.name: cls for cls in (_resolved(n) for n in [*BUILTIN_TOOLS, *tools]) if cls is not None}
    if section in classes:  # configured, without settings
        return dataclasses.replace(
            issue,
            reason=f"tool {section!r} declares no settings (its class "
            f"{classes[section].__name__} sets no config_class).",
            fix=f"remove {issue.key}, or give {classes[section].__name__} a config_class "
            "dataclass (docs/extending.md).",
        )
    unresolved = [n for n in tools if _resolved(n) is None]
    configured = {cls.name for cls in (_resolved(n) for n in tools) if cls is not None}
    return dataclasses.replace(
        issue,
        reason=f"no configured tool is named {section!r}; its settings have no section (configured tools: "
        f"{', '.join(sorted(configured)) or 'none'}; built-in sections: {', '.join(sorted(BUILTIN_TOOLS))}).",
        fix=f"fix {listed} first: {', '.join(unresolved)} does not resolve (its section is known once it does)."
        if unresolved
        else f"add the tool to {listed} (a registered name or pkg.module:Class) or remove {issue.key}.",
    )


def _resolved(name: str):
    try:
        return resolve_tool(name)
    except ToolNameError:
        return None


def load_config(name_or_path: str | Path, overrides: Iterable[str] = (), strict: bool = True) -> ExperimentConfig:
    """The typed config of an experiment (a .yaml path, or a name looked up in examples/searchr1/config/, then
    examples/mmsearch/config/).

    strict=True raises ConfigError listing every problem; strict=False returns the config anyway (invalid
    keys keep their schema defaults) and raises only if the YAML cannot be composed.
    """
    checked = check_config(name_or_path, overrides)
    if checked.cfg is None or (strict and checked.issues):
        raise ConfigError(str(name_or_path), checked.issues)
    return checked.cfg


def validate(cfg: ExperimentConfig, check_paths: bool = False) -> list[ConfigIssue]:
    """Rule checks of a typed config (and path existence with check_paths=True, as at run start); warnings
    included (``ConfigIssue.warning``)."""
    return run_rules(cfg, check_paths=check_paths)


def to_dictconfig(cfg: ExperimentConfig) -> DictConfig:
    """The resolved config as the OmegaConf DictConfig RLinf's Cluster and placement read: the typed config plus
    RLinf's keys that rlinf_ext does not implement, at their accepted values (``config/compat.py``)."""

    def lookup(dotted: str):
        value = cfg
        for part in dotted.split("."):
            value = getattr(value, part)
        return value

    return OmegaConf.create(with_compat_keys(dataclasses.asdict(cfg), lookup))


def to_yaml(cfg: ExperimentConfig) -> str:
    return OmegaConf.to_yaml(to_dictconfig(cfg))
