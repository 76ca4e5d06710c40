"""Search-R1 reward: format-aware values, tag spam penalty, search penalty, scale, registry."""

import pytest

from rlinf_ext.protocol.agents import agent_spec
from rlinf_ext.rewards import RewardConfig, is_well_formed, searchr1_reward

GOOD = (
    "<think>need info</think><search> capital of france </search>\n\n"
    '<information>Doc 1(Title: "Paris") Paris is the capital.</information>\n\n'
    "<think>it is Paris</think>\n<answer> Paris </answer><|im_end|>"
)


def test_well_formed_grammar():
    assert is_well_formed(GOOD)
    assert is_well_formed("<think>x</think><answer>y</answer>")
    assert not is_well_formed("<answer>y</answer>")  # no think first
    assert not is_well_formed("<think>x</think> stray <answer>y</answer>")
    assert not is_well_formed("<think>x</think><answer>y</answer> trailing")
    # the model's own text without the inserted observation is judged by the same rule
    assert is_well_formed("<think>x</think><search>q</search><think>y</think><answer>z</answer>")
    assert not is_well_formed("<think>x</think><search>q</search><answer>z</answer>")  # no think after search
    assert not is_well_formed("<think>x</think><search>q</search><information>d</information><answer>z</answer>")
    assert not is_well_formed("<think>x</think>")  # never answered
    invalid_msg = (
        "<think>x</think>\nMy previous action is invalid. Let me try again.\n<think>y</think><answer>a</answer>"
    )
    assert not is_well_formed(invalid_msg)


@pytest.mark.parametrize(
    "response,gold,expected",
    [
        (GOOD, ["Paris"], 1.0),
        ("<answer> Paris </answer>", ["Paris"], 0.8),
        (GOOD, ["Rome"], 0.2),
        ("<think>x</think>", ["Rome"], 0.0),  # no answer, malformed (never answered)
        ("junk <answer> Madrid </answer>", ["Rome"], 0.1),
    ],
)
def test_format_aware_values(response, gold, expected):
    result = searchr1_reward(response, gold, RewardConfig(scoring="format"))
    assert result.score == pytest.approx(expected)


def test_em_scoring_reads_response_only_and_reports_fields():
    result = searchr1_reward(GOOD, {"target": ["paris", "Lutetia"]}, RewardConfig(scoring="em"))
    assert (result.score, result.em, result.subem, result.answer, result.well_formed) == (1.0, 1.0, 1.0, "Paris", True)


def test_tag_spam_penalty_over_limit_only():
    ten = "<think>x</think>" + "<answer>Paris</answer>" * 10
    eleven = "<think>x</think>" + "<answer>Paris</answer>" * 11
    cfg = RewardConfig(scoring="em", answer_tag_limit=10)
    assert searchr1_reward(ten, ["Paris"], cfg).score == 1.0
    assert searchr1_reward(eleven, ["Paris"], cfg).score == 0.25
    assert searchr1_reward(eleven, ["Rome"], cfg).score == 0.0


def test_search_penalty_and_scale():
    cfg = RewardConfig(scoring="em", search_penalty=0.1, reward_scale=2.0)
    assert searchr1_reward(GOOD, ["Paris"], cfg, num_searches=1).score == pytest.approx(1.8)
    assert searchr1_reward(GOOD, ["Paris"], cfg, num_searches=0).score == pytest.approx(2.0)
    assert searchr1_reward(GOOD, ["Rome"], cfg, num_searches=1).score == 0.0


def test_unicode_answer():
    assert searchr1_reward("<answer>Zürich</answer>", ["zürich"]).score == 1.0
    assert searchr1_reward("<answer>Zurich</answer>", ["Zürich"]).score == 0.0


def test_the_agents_reward_and_bad_scoring():
    assert agent_spec("searchr1").load("reward") is searchr1_reward
    with pytest.raises(ValueError, match="reward.scoring"):
        searchr1_reward(GOOD, ["Paris"], RewardConfig(scoring="bleu"))


def test_well_formed_over_the_configured_tool_tags():
    two_tools = ("search", "calculate")
    calc = "<think>x</think><calculate>1+1</calculate><information>2</information><think>y</think><answer>2</answer>"
    assert is_well_formed(calc, two_tools) and not is_well_formed(calc)  # the default set is Search-R1's
    mixed = (
        "<think>a</think><search>q</search><information>d</information><think>b</think>"
        "<calculate>1+1</calculate><think>c</think><answer>2</answer>"
    )
    assert is_well_formed(mixed, two_tools)
    assert not is_well_formed(mixed, ("calculate",))  # search is not configured
    assert not is_well_formed("<think>x</think><calculate>1+1</search><think>y</think><answer>2</answer>", two_tools)
    assert is_well_formed("<think>x</think><answer>y</answer>", ())  # no tools: think then answer
    # the reward passes the tags on: correct and well-formed only with the tool's tag
    assert searchr1_reward(calc, ["2"], RewardConfig(scoring="format"), tool_tags=two_tools).score == 1.0
    assert searchr1_reward(calc, ["2"], RewardConfig(scoring="format")).score == 0.8
