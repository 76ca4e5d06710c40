"""The Search-R1 agent's tools: the names its loop section lists (``agentloop.tools``), built or as tags. The one
place that says where the section is, for the rollout, the reward worker, evaluation and validation."""

from __future__ import annotations

from typing import Any

from rlinf_ext.tools.base import Tool, ToolContext
from rlinf_ext.tools.registry import build_tools, tool_classes


def loop_section(cfg: Any) -> Any:
    """The Search-R1 loop's config section (its settings and its `tools`) in an experiment config."""
    return cfg.agentloop


def searchr1_tools(cfg: Any, context: ToolContext | None = None) -> list[Tool]:
    """The configured tools, built (``context`` None: the run's seed, no node or server override)."""
    return build_tools(list(loop_section(cfg).tools), cfg, context)


def searchr1_tool_tags(cfg: Any) -> list[str]:
    """The configured tools' tag names (what the format reward accepts), without building the tools."""
    return [cls.tag_name() for cls in tool_classes(list(loop_section(cfg).tools))]
