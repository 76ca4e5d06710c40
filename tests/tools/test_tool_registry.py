"""Tools by name: the registry resolves short names and import paths, and says what is wrong with a tool list."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.tools.base import Tool, ToolContext, ToolOutput
from rlinf_ext.tools.registry import ToolNameError, build_tools, check_tool_names, resolve_tool
from rlinf_ext.tools.search import TextSearch


class Echo(Tool):
    name = "echo"

    async def __call__(self, content):
        return ToolOutput(body=content)


class Thinks(Tool):
    name = "thinker"
    tag = "think"


class EchoTwin(Tool):
    name = "echo"
    tag = "echo2"


@pytest.fixture
def plugin_module(monkeypatch):
    """A module of tool classes importable by path (as a plug-in package on PYTHONPATH would be)."""
    module = types.ModuleType("my_tools")
    module.Echo, module.Thinks, module.EchoTwin, module.not_a_tool = Echo, Thinks, EchoTwin, object
    monkeypatch.setitem(sys.modules, "my_tools", module)
    return module


def test_short_name_and_import_path(plugin_module):
    assert resolve_tool("search") is TextSearch
    assert resolve_tool("my_tools:Echo") is Echo
    assert check_tool_names(["search", "my_tools:Echo"]) == []


def test_unknown_names_say_the_choices_and_the_import_path_form(plugin_module):
    with pytest.raises(ToolNameError, match=r"registered tool \(\['search'\]\).*'pkg\.module:Class'"):
        resolve_tool("calculator")
    with pytest.raises(ToolNameError, match="cannot import module"):
        resolve_tool("no_such_pkg.tools:Calc")
    with pytest.raises(ToolNameError, match="has no attribute 'Calc'"):
        resolve_tool("my_tools:Calc")
    with pytest.raises(ToolNameError, match="not a subclass of rlinf_ext.tools.base.Tool"):
        resolve_tool("my_tools:not_a_tool")


def test_tag_collisions(plugin_module):
    (reserved,) = check_tool_names(["my_tools:Thinks"])
    assert "<think>" in reserved and "another tag" in reserved
    assert check_tool_names(["my_tools:Echo", "my_tools:EchoTwin"]) == [
        "tools 'my_tools:Echo' and 'my_tools:EchoTwin' share the name 'echo'"]
    assert check_tool_names(["search", "search"]) == [
        "tools 'search' and 'search' share the name 'search'", "tools 'search' and 'search' share the tag <search>"]


def test_defaults_derive_from_the_name(plugin_module):
    assert (Echo.open_tag(), Echo.close_tag(), Echo.stops()) == ("<echo>", "</echo>", ("</echo>",))
    assert Echo.invalid_action_line() == "If I want to use the echo tool, I should put its input between <echo> and </echo>."
    assert Echo.metric_names().calls == "echo_calls"
    assert TextSearch.metric_names().calls == "searches"  # Search-R1's metric names are kept


def test_build_tools_passes_the_context_and_run_counts(plugin_module):
    cfg = ExperimentConfig()
    search, echo = build_tools(["search", "my_tools:Echo"], cfg, ToolContext(seed=5, search_server_addr="10.0.0.1:80"))
    assert search.client.urls == ["http://10.0.0.1:80"] and echo.stats.calls == 0
    output = asyncio.run(echo.run("hi"))
    assert output.body == "hi" and output.latency_s is not None and echo.stats.calls == 1
    with pytest.raises(ToolNameError, match="calculator"):
        build_tools(["calculator"], cfg)
