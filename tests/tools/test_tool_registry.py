"""Tools by name: the registry resolves short names and import paths, and says what is wrong with a tool list."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.tools.base import Tool, ToolContext, ToolOutput
from rlinf_ext.tools.config import SearchToolConfig
from rlinf_ext.tools.registry import ToolNameError, build_tools, check_tool_names, resolve_tool
from rlinf_ext.tools.search import TextSearch


class Echo(Tool):
    name = "echo"

    async def __call__(self, content):
        return ToolOutput(body=content)


class Thinks(Echo):
    name = "thinker"
    tag = "think"


class EchoTwin(Echo):
    name = "echo"
    tag = "echo2"


class Uncallable(Tool):  # the new user's tool: settings and a name, no __call__
    name = "uncallable"


class Blocking(Tool):
    name = "blocking"

    def __call__(self, content):
        return ToolOutput(body=content)


class Unsettled(Echo):  # settings that are not a dataclass
    name = "unsettled"
    config_class = dict


class Dashed(Echo):  # settings under a name that cannot be a section's key
    name = "my-tool"
    config_class = SearchToolConfig


@pytest.fixture
def plugin_module(monkeypatch):
    """A module of tool classes importable by path (as a plug-in package on PYTHONPATH would be)."""
    module = types.ModuleType("my_tools")
    module.Echo, module.Thinks, module.EchoTwin, module.not_a_tool = Echo, Thinks, EchoTwin, object
    module.Uncallable, module.Blocking, module.Unsettled, module.Dashed = Uncallable, Blocking, Unsettled, Dashed
    monkeypatch.setitem(sys.modules, "my_tools", module)
    return module


def test_short_name_and_import_path(plugin_module):
    assert resolve_tool("search") is TextSearch
    assert resolve_tool("my_tools:Echo") is Echo
    assert check_tool_names(["search", "my_tools:Echo"]) == []


def test_unknown_names_say_the_choices_and_the_import_path_form(plugin_module):
    with pytest.raises(ToolNameError, match=r"registered tool \(\['image_search', 'search'\]\).*'pkg\.module:Class'"):
        resolve_tool("calculator")
    with pytest.raises(ToolNameError, match="cannot import module"):
        resolve_tool("no_such_pkg.tools:Calc")
    with pytest.raises(ToolNameError, match="has no attribute 'Calc'"):
        resolve_tool("my_tools:Calc")
    with pytest.raises(ToolNameError, match="not a subclass of rlinf_ext.tools.base.Tool"):
        resolve_tool("my_tools:not_a_tool")


def test_tag_collisions(plugin_module):
    (reserved,) = check_tool_names(["my_tools:Thinks"])
    assert "<think>" in reserved.problem and "tag = '...' on Thinks" in reserved.fix
    assert [str(p) for p in check_tool_names(["my_tools:Echo", "my_tools:EchoTwin"])] == [
        "tools 'my_tools:Echo' and 'my_tools:EchoTwin' share the name 'echo'"
    ]
    assert [(p.problem, p.fix) for p in check_tool_names(["search", "search"])] == [
        ("tools 'search' and 'search' share the name 'search'", "give one of them another name (or list it once)."),
        ("tools 'search' and 'search' share the tag <search>", "give one of them another tag."),
    ]


@pytest.mark.parametrize(
    "path, problem, fix",
    [
        (
            "my_tools:Uncallable",
            "does not implement __call__",
            "async def __call__(self, content: str) -> ToolOutput` on Uncallable",
        ),
        ("my_tools:Blocking", "is not a coroutine function", "async def __call__"),
        ("calculator", "neither a registered tool", "the import path of a Tool subclass"),
        ("no_such_pkg.tools:Calc", "cannot import module", "PYTHONPATH"),
        ("my_tools:not_a_tool", "not a subclass", "derive the class from rlinf_ext.tools.base.Tool"),
    ],
)
def test_each_refusal_states_its_own_fix_and_validate_refuses_it(plugin_module, path, problem, fix):
    from rlinf_ext.config import check_config

    (found,) = check_tool_names([path])
    assert problem in found.problem and fix in found.fix, found
    issues = [
        i
        for i in check_config("tiny-cpu", [f"agentloop.searchr1.tools=[{path}]"]).issues
        if i.key == "agentloop.searchr1.tools"
    ]
    assert [(i.reason, i.fix) for i in issues] == [(found.problem, found.fix)]


def test_defaults_derive_from_the_name(plugin_module):
    assert (Echo.open_tag(), Echo.close_tag(), Echo.stops()) == ("<echo>", "</echo>", ("</echo>",))
    assert (
        Echo.invalid_action_line()
        == "If I want to use the echo tool, I should put its input between <echo> and </echo>."
    )
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


def test_the_agents_stops_follow_its_tools(plugin_module):
    from rlinf_ext.config import check_config, load_config
    from rlinf_ext.tools.registry import agent_stops

    assert agent_stops(load_config("tiny-cpu")) == ("</search>", "</answer>")
    tools = "agentloop.searchr1.tools=[search,my_tools:Echo]"
    assert agent_stops(check_config("tiny-cpu", [tools]).cfg) == ("</search>", "</echo>", "</answer>")
    stale = check_config("tiny-cpu", [tools, "algorithm.sampling_params.stop=[</search>,</answer>]"])
    (warning,) = [w for w in stale.warnings if w.key == "algorithm.sampling_params.stop"]  # the loop adds it: runs
    assert "missing ['</echo>']" in warning.reason and "add ['</echo>']" in warning.fix and stale.ok


def test_settings_must_be_a_dataclass_under_an_identifier(plugin_module):
    (unsettled,) = check_tool_names(["my_tools:Unsettled"])
    assert "config_class is <class 'dict'>, not a dataclass" in unsettled.problem and "@dataclass" in unsettled.fix
    (dashed,) = check_tool_names(["my_tools:Dashed"])
    assert "'my-tool' is not a Python identifier" in dashed.problem and "tools.<name>" in dashed.problem


def test_a_tools_settings_default_when_the_config_has_no_section():
    """A config made in code without the loader's sections: the tool reads its defaults (as any key left out)."""
    assert TextSearch.settings(ExperimentConfig()) == SearchToolConfig()
    with pytest.raises(TypeError, match="echo.*declares no settings.*config_class"):
        Echo.settings(ExperimentConfig())
