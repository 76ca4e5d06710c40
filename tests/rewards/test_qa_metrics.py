"""Reward edge cases, hand-computed (peers' bugs included)."""

import numpy as np
import pytest

from rlinf_ext.rewards import (
    count_answer_tags,
    exact_match,
    extract_answer,
    f1,
    golden_list,
    normalize_answer,
    sub_exact_match,
)

SEARCHR1_PROMPT = (
    "Answer the given question. ... For example, <answer> Beijing </answer>. Question: capital of china?\n"
)


def test_normalize_answer_articles_punctuation_case():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("A cat, an apple and THE dog.") == "cat apple and dog"
    # whole words only: "theater" keeps its "the"
    assert normalize_answer("Theater") == "theater"


def test_normalize_answer_unicode_kept():
    # non-ASCII punctuation and letters are not ASCII punctuation: they stay (Search-R1 behaviour)
    assert normalize_answer("Zürich") == "zürich"
    assert normalize_answer("São Paulo") == "são paulo"
    assert normalize_answer("東京") == "東京"


def test_prompt_example_answer_never_counts():
    # The response alone has no answer: the prompt's "<answer> Beijing </answer>" must not be read.
    response = "<think>I am not sure.</think>"
    assert extract_answer(response) is None
    assert exact_match(response, ["Beijing"]) == 0.0
    # Documenting the peer bug: reading prompt+response would have scored 1.
    assert exact_match(SEARCHR1_PROMPT + response, ["Beijing"]) == 1.0


def test_no_answer_tag_scores_zero():
    assert exact_match("Beijing", "Beijing") == 0.0
    assert sub_exact_match("Beijing", "Beijing") == 0.0
    assert f1("Beijing", "Beijing") == 0.0


def test_last_answer_tag_wins():
    response = "<answer> Paris </answer> hmm <answer>Beijing</answer>"
    assert extract_answer(response) == "Beijing"
    assert exact_match(response, ["beijing"]) == 1.0
    assert exact_match("<answer>Beijing</answer><answer>Paris</answer>", ["beijing"]) == 0.0


def test_answer_inside_information_block_is_ignored():
    response = "<search> q </search>\n\n<information>Doc 1 <answer>Rome</answer></information>\n\n<think>x</think>"
    assert extract_answer(response) is None
    unclosed = "<search> q </search><information>Doc 1 <answer>Rome</answer>"
    assert extract_answer(unclosed) is None


def test_golden_answer_shapes():
    assert golden_list("a") == ["a"]
    assert golden_list(["a", "b"]) == ["a", "b"]
    assert golden_list({"target": np.array(["x", "y"])}) == ["x", "y"]
    assert exact_match("<answer>the Y.</answer>", {"target": ["x", "y"]}) == 1.0
    with pytest.raises(ValueError, match="target"):
        golden_list({"answers": ["a"]})
    with pytest.raises(TypeError):
        golden_list(3)


def test_sub_exact_match_and_f1_by_hand():
    response = "<answer>Barack Obama Jr</answer>"
    assert exact_match(response, ["Barack Obama"]) == 0.0
    assert sub_exact_match(response, ["Barack Obama"]) == 1.0
    # pred tokens: barack obama jr (3); gold: barack obama (2); overlap 2 -> P=2/3, R=1, F1=0.8
    assert f1(response, ["Barack Obama"]) == pytest.approx(0.8)
    assert f1(response, ["nobody", "Obama"]) == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))


def test_count_answer_tags():
    assert count_answer_tags("<answer>a</answer>" * 11) == 11
    assert count_answer_tags("<answer>a" + "</answer>" * 3) == 3
    assert count_answer_tags("none") == 0
