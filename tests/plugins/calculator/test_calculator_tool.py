"""The calculator plug-in (``tool.py``, outside ``rlinf_ext/``) added to Search-R1 by config alone: it resolves by
import path, the loop stops at and acts on its tag, its observation is environment text, the invalid-action text
names it, and its trajectories are scored as well-formed (and are not when the tool is left out of the config)."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from examples.plugins.calculator.tool import Calculator, CalculatorError, CalculatorSettings, evaluate
from rlinf_ext.agent.core.results import result_from_group
from rlinf_ext.agent.searchr1.config import LoopSettings, loop_section
from rlinf_ext.agent.searchr1.loop import run_trajectory, summarize_metrics
from rlinf_ext.agent.searchr1.protocol import TurnProtocol
from rlinf_ext.cli import main
from rlinf_ext.config import check_config
from rlinf_ext.config.schema import RewardConfig
from rlinf_ext.protocol.agents import agent_tools
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.rewards.searchr1 import searchr1_reward
from rlinf_ext.tools.base import ToolContext
from rlinf_ext.tools.registry import build_agent_tools, check_tool_names, tool_tags
from rlinf_ext.tools.search import TextSearch
from rlinf_ext.workers.reward import score_result_details
from tests.support.scripted import CharTokenizer, ScriptedGenerator

CALCULATOR = "examples.plugins.calculator.tool:Calculator"
TOK = CharTokenizer()
PROMPT = TOK.encode("Question: what is 2*(3+4)?\n")
CALL_TURN = "<think> I should compute it. </think>\n<calculate> 2*(3+4) </calculate>"
ANSWER_TURN = "<think> The tool says 14. </think>\n<answer> 14 </answer>"


@pytest.fixture(scope="module")
def cfg():
    """The tiny Search-R1 experiment with the calculator configured by import path, checked like any run; two turns
    and room for the invalid-action text (tiny-cpu itself allows one short search turn)."""
    checked = check_config(
        "tiny-cpu",
        [
            f"agentloop.searchr1.tools=[search,{CALCULATOR}]",
            "agentloop.searchr1.max_turns=2",
            "runner.seq_length=1024",
            "agentloop.response_length_total=768",
            "agentloop.max_obs_length=320",
        ],
    )
    assert checked.ok, checked.issues
    return checked.cfg


WITH_CALCULATOR = f"agentloop.searchr1.tools=[search,{CALCULATOR}]"


def test_its_settings_validate_by_key_and_reach_the_tool(capsys):
    """tools.calculator.* is typed by the tool's own config_class (written here, outside rlinf_ext) and reaches
    from_config; a bad value, an unknown key and the section of a tool not configured are refused by name."""
    assert main(["validate", "tiny-cpu", WITH_CALCULATOR, "tools.calculator.max_digits=5"]) == 0
    assert "valid" in capsys.readouterr().out
    cfg = check_config("tiny-cpu", [WITH_CALCULATOR, "tools.calculator.max_digits=3"]).cfg
    assert cfg.tools.calculator == CalculatorSettings(max_digits=3)
    (calculator,) = [
        t for t in build_agent_tools(cfg, ToolContext(search_server_addr="127.0.0.1:8000")) if isinstance(t, Calculator)
    ]
    assert asyncio.run(calculator("1/3")).body == "0.333"
    assert (
        main(["validate", "tiny-cpu", WITH_CALCULATOR, "tools.calculator.max_digits=abc", "tools.calculator.nope=1"])
        == 1
    )
    err = capsys.readouterr().err
    assert "tools.calculator.max_digits: expected int, got str 'abc'" in err and "tools.calculator.max_digits=4" in err
    assert "tools.calculator.nope: unknown key" in err and "tools.calculator.max_digits" in err.split("nope")[1]


@pytest.mark.parametrize(
    "overrides, key, reason, fix",
    [
        (
            [WITH_CALCULATOR, "tools.calculator.max_digits=0"],
            "tools.calculator.max_digits",
            "must be >= 1, got 0",
            "tools.calculator.max_digits=12",
        ),  # the settings' own problems(), run by validate
        (
            ["tools.calculator.max_digits=5"],
            "tools.calculator",
            "no configured tool is named 'calculator'",
            "add the tool to agentloop.searchr1.tools",
        ),
        (
            [
                WITH_CALCULATOR.replace("calculator.tool:Calculator", "calculator.tool:Nope"),
                "tools.calculator.max_digits=5",
            ],
            "tools.calculator",
            "configured tools: search",
            f"fix agentloop.searchr1.tools first: {CALCULATOR.replace('Calculator', 'Nope')} does not resolve",
        ),
        (
            [WITH_CALCULATOR, "tools.Calculator.max_digits=5"],
            "tools.Calculator",  # keyed by the tool's name
            "no configured tool is named 'Calculator'; its settings have no section (configured tools: calculator, search;",
            "or remove tools.Calculator",
        ),
    ],
)
def test_tool_settings_refused_by_name(overrides, key, reason, fix):
    issues = [i for i in check_config("tiny-cpu", overrides).issues if i.key == key]
    assert len(issues) == 1 and reason in issues[0].reason and fix in issues[0].fix, issues


class PlainCalculator(Calculator):
    config_class = None


def test_a_tool_without_settings_says_so():
    plain = WITH_CALCULATOR.replace(CALCULATOR, f"{__name__}:PlainCalculator")
    (issue,) = check_config("tiny-cpu", [plain, "tools.calculator.max_digits=5"]).issues
    assert issue.key == "tools.calculator" and "declares no settings" in issue.reason and "config_class" in issue.fix


def _echo(value):
    return value


def test_a_config_with_a_tools_settings_pickles_into_a_fresh_process():
    """The class mounting tools.calculator is found by name (config/agent_schema.py), as Ray's workers need."""
    cfg = check_config("tiny-cpu", [WITH_CALCULATOR, "tools.calculator.max_digits=5"]).cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        back = pool.submit(_echo, cfg).result()
    assert back == cfg and back.tools.calculator.max_digits == 5


def test_configured_by_import_path_and_built_like_the_worker_does(cfg):
    assert list(loop_section(cfg).tools) == ["search", CALCULATOR] and check_tool_names(loop_section(cfg).tools) == []
    # the worker's context: its seed, node and the retrieval server the launcher started
    tools = build_agent_tools(cfg, ToolContext(seed=3, node_ip="127.0.0.1", search_server_addr="127.0.0.1:8000"))
    assert [type(t) for t in tools] == [TextSearch, Calculator]
    assert tool_tags(agent_tools(cfg)) == ["search", "calculate"]


def _trajectory(cfg, script, with_tools=False):
    gen = ScriptedGenerator(script)
    tools = build_agent_tools(cfg, ToolContext(search_server_addr="127.0.0.1:8000"))
    traj = asyncio.run(
        run_trajectory(
            gen,
            TOK,
            PROMPT,
            ["14"],
            LoopSettings.from_config(cfg),
            tools,
            sampling_params=SamplingParams(stop=["<|im_end|>"]),
        )
    )
    return (gen, traj, tools) if with_tools else (gen, traj)


def test_a_calculator_trajectory_is_stopped_observed_masked_and_scored_well_formed(cfg):
    gen, traj, tools = _trajectory(cfg, [CALL_TURN + " trailing text the engine never sends", ANSWER_TURN], True)
    assert "</calculate>" in gen.calls[0].params.stop and gen.calls[0].result.matched_stop == "</calculate>"
    call, answer = traj.turns
    assert (call.action, call.tool, call.query, call.tool_ok) == ("calculator", "calculator", "2*(3+4)", True)
    assert TOK.decode(call.observation_ids) == "\n\n<information>14</information>\n\n"
    n_call = len(call.response_ids)
    assert traj.response_mask[n_call : n_call + len(call.observation_ids)] == [0] * len(call.observation_ids)
    assert traj.end_reason == "answer" and answer.action == "answer"
    assert traj.metrics["calculator_calls"] == 1 and traj.metrics["searches"] == 0
    step = summarize_metrics([traj], tools)  # the step's agent/<name> metrics: per tool, Search-R1's names kept
    assert step["agent/calculator_calls"] == 1.0 and step["agent/calculator_failure_rate"] == 0.0
    assert step["agent/searches"] == 0.0 and step["agent/search_failure_rate"] == 0.0

    # the reward worker's path: the configured tools' tags reach the format score
    result = result_from_group([traj])
    reward_cfg = RewardConfig(scoring="format")
    tags = tool_tags(agent_tools(cfg))
    assert score_result_details(result, reward_cfg, searchr1_reward, tool_tags=tags)[:2] == ([1.0], [1.0])
    # the old silent trap: without the calculator's tag the same correct response scores as malformed
    assert score_result_details(result, reward_cfg, searchr1_reward)[:2] == ([0.8], [1.0])


def test_the_invalid_action_text_names_the_calculator(cfg):
    protocol = TurnProtocol.of(build_agent_tools(cfg, ToolContext(search_server_addr="127.0.0.1:8000")))
    assert (
        "If I want to search, I should put the query between <search> and </search>. If I want to calculate, "
        "I should put the expression between <calculate> and </calculate>. If I want to give the final answer"
    ) in protocol.invalid_action_message
    _, traj = _trajectory(cfg, ["<think> hmm </think> 2*(3+4) is 14", ANSWER_TURN])  # no tag: invalid
    assert TOK.decode(traj.turns[0].observation_ids) == protocol.invalid_action_message


def test_a_failed_calculation_is_a_failure_observation(cfg):
    gen, traj = _trajectory(cfg, ["<calculate> 1/0 </calculate>", ANSWER_TURN])
    assert traj.turns[0].tool_ok is False and traj.metrics["calculator_failures"] == 1
    assert "The calculation failed (division by zero)" in TOK.decode(traj.turns[0].observation_ids)


@pytest.mark.parametrize("expression, value", [("2*(3+4)", 14), ("-1.5 + 4 / 2", 0.5), ("((7))", 7)])
def test_evaluate_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression", ["__import__('os').system('true')", "x + 1", "2 ** 100000", "True + 1", "abs(-1)", "1 +", "9" * 300]
)
def test_evaluate_refuses_anything_else(expression):
    with pytest.raises(CalculatorError):
        evaluate(expression)


def test_the_reward_worker_scores_with_the_configured_tags(cfg):
    import queue
    from dataclasses import replace

    from rlinf_ext.workers.reward import RewardWorker

    _, traj = _trajectory(cfg, [CALL_TURN, ANSWER_TURN])
    worker = RewardWorker.__new__(RewardWorker)  # no Ray actor: the method and the config it reads
    worker.cfg, worker._timer_metrics = replace(cfg, reward=replace(cfg.reward, scoring="format")), {}
    worker.init_worker()  # the agent's reward and its tools' tags
    inbox, outbox = queue.Queue(), queue.Queue()
    inbox.put(result_from_group([traj]))
    out = worker.compute_rewards(inbox, outbox, num_results=1, step=0)
    assert out.rewards == {traj.uid: [1.0]} and outbox.get_nowait().rewards.tolist() == [1.0]
