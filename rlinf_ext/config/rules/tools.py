"""Tool rules: text search and the retrieval server it queries."""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.config.rule_registry import rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue
from rlinf_ext.protocol.agents import agent_section, agent_spec, agent_tools
from rlinf_ext.tools.registry import SEARCH, check_tool_names


@rule("tools.search.topk")
def search_topk_positive(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.tools.search.topk < 1:
        yield ConfigIssue(
            "tools.search.topk", f"must be >= 1, got {cfg.tools.search.topk}.", "set tools.search.topk=3."
        )


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
