"""Tool rules: the tools' own settings, the configured list, and the retrieval server text search queries."""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.config.rule_registry import rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue
from rlinf_ext.protocol.agents import agent_section, agent_spec, agent_tools
from rlinf_ext.tools.base import setting_problems
from rlinf_ext.tools.registry import SEARCH, check_tool_names, settings_sections


@rule("agentloop.agent")
def tool_settings(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Each tool's settings (``tools.<name>``) as its config_class's ``problems()`` checks them: the one place a
    tool's value ranges are written (the built-in tools' clients refuse the same values when built in code)."""
    for name in settings_sections(agent_tools(cfg)):
        for problem in setting_problems(getattr(cfg.tools, name)):
            yield ConfigIssue(f"tools.{name}.{problem.key}", problem.problem, problem.fix)


@rule("agentloop.agent", "retrieval.launch", "retrieval.index_dir", "retrieval.corpus_path", "tools.search.server_addr")
def retrieval_source(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """A local text search needs a server; an agent that does not search needs none."""
    if cfg.tools.search.backend != "local" or SEARCH not in agent_tools(cfg):
        return
    if cfg.retrieval.launch:
        for key in ("index_dir", "corpus_path"):
            if getattr(cfg.retrieval, key) is None:
                yield ConfigIssue(
                    f"retrieval.{key}",
                    "retrieval.launch is true but no value is set, so the server cannot start.",
                    f"set retrieval.{key}=PATH.",
                )
    elif cfg.tools.search.server_addr is None:
        yield ConfigIssue(
            "tools.search.server_addr",
            "no retrieval server: tools.search.server_addr is null and retrieval.launch is false.",
            "set tools.search.server_addr=HOST:PORT or retrieval.launch=true.",
        )


@rule("agentloop.agent")
def agent_tools_resolve(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Every tool an agent's section lists is a registered name or an importable Tool subclass, with its own tag."""
    names = getattr(agent_section(cfg), "tools", None)
    if names is None:
        return
    for problem in check_tool_names([str(n) for n in names]):
        yield ConfigIssue(f"agentloop.{agent_spec(cfg).name}.tools", problem.problem, problem.fix)
