"""``turn_end``: where a turn ends and why, the rule every engine's reply follows (hand-computed cases on a toy
vocabulary; ``stop_completed_at`` decodes the tail, so stop strings spanning tokens are found)."""

from __future__ import annotations

from rlinf_ext.generation.turn_end import TurnEnd, stop_completed_at, turn_end

VOCAB = {1: "<search>", 2: " q", 3: "</", 4: "search>", 5: " a", 6: "<|im_end|>", 7: "<pad>", 8: "</answer>"}
EOS = 6
STOPS = ["</search>", "</answer>"]


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def must_not_decode(ids: list[int]) -> str:
    raise AssertionError("the engine's own text must be used when the ids are not cut")


def hf(ids, budget=8, include=True):
    """An HF-style raw row: the engine said nothing, rows may run past their end (padding, a larger budget)."""
    return turn_end(ids, decode, eos_ids={EOS}, stop=STOPS, max_new_tokens=budget, include_stop_str_in_output=include)


def sglang(ids, reason, budget=8, matched=None, text=None, include=True):
    """An SGLang-style reply: the engine's own finish reason (SGLang checks the budget before EOS and stops)."""
    return turn_end(
        ids,
        decode,
        eos_ids={EOS},
        stop=STOPS,
        max_new_tokens=budget,
        include_stop_str_in_output=include,
        engine_reason=reason,
        engine_stop=matched,
        text=text,
    )


# ---------------------------------------------------------------------------------------------- HF style
def test_hf_cuts_after_the_token_completing_a_stop_string_split_over_tokens():
    # "</" + "search>" completes "</search>" at token 4; the " a" and padding after it go
    assert hf([1, 2, 3, 4, 5, 7, 7]) == TurnEnd([1, 2, 3, 4], "<search> q</search>", "stop", "</search>")


def test_hf_excluded_stop_string_leaves_the_ids_and_cuts_the_text():
    assert hf([1, 2, 3, 4, 5], include=False) == TurnEnd([1, 2, 3, 4], "<search> q", "stop", "</search>")


def test_hf_eos_is_kept_and_ends_the_turn_before_a_later_stop():
    assert hf([5, EOS, 8, 7]) == TurnEnd([5, EOS], " a<|im_end|>", "eos", None)


def test_hf_budget_is_the_rows_own():
    # the batch ran to 5 tokens; this row allowed 3 and none of them ends the turn
    assert hf([5, 2, 5, 8, 7], budget=3) == TurnEnd([5, 2, 5], " a q a", "length", None)


def test_hf_eos_on_the_last_allowed_token_is_eos():
    assert hf([5, 2, EOS, 5], budget=3) == TurnEnd([5, 2, EOS], " a q<|im_end|>", "eos", None)


def test_hf_stop_completed_by_the_last_allowed_token_is_stop():
    assert hf([2, 3, 4, 5], budget=3) == TurnEnd([2, 3, 4], " q</search>", "stop", "</search>")


# ------------------------------------------------------------------------------------------ SGLang style
def test_sglang_eos_and_stop_are_kept_as_the_engine_says_with_its_text():
    assert sglang([5, EOS], "eos", text=" a<|im_end|>") == TurnEnd([5, EOS], " a<|im_end|>", "eos", None)
    got = sglang([1, 2, 3, 4], "stop", matched="</search>", text="<search> q</search>", include=False)
    assert got == TurnEnd([1, 2, 3, 4], "<search> q", "stop", "</search>")


def test_sglang_length_without_an_end_stays_length_and_decodes_when_there_is_no_text():
    assert sglang([5, 2, 5], "length", budget=3) == TurnEnd([5, 2, 5], " a q a", "length", None)


def test_sglang_length_on_eos_at_the_last_allowed_token_is_eos():
    got = sglang([5, 2, EOS], "length", budget=3, text=" a q<|im_end|>")
    assert got == TurnEnd([5, 2, EOS], " a q<|im_end|>", "eos", None)


def test_sglang_length_on_a_stop_completed_by_the_last_allowed_token_is_stop():
    got = sglang([2, 3, 4], "length", budget=3, text=" q</search>")
    assert got == TurnEnd([2, 3, 4], " q</search>", "stop", "</search>")
    excluded = sglang([2, 3, 4], "length", budget=3, text=" q</search>", include=False)
    assert excluded == TurnEnd([2, 3, 4], " q", "stop", "</search>")


def test_sglang_length_checks_only_the_last_token():
    # the engine already checked tokens 1..n-1; an EOS id there is not looked at again (it never happens, and
    # rescanning would cost a decode per token)
    assert sglang([EOS, 5], "length", budget=2, text="x").finish_reason == "length"


def test_both_styles_agree_on_the_same_sampled_tokens():
    for ids, budget in (([5, 2, EOS], 3), ([2, 3, 4], 3), ([5, 2, 5], 3), ([5, EOS], 8)):
        reason = "eos" if ids[-1] == EOS and len(ids) < budget else "length"
        assert sglang(ids, reason, budget=budget) == hf(ids + [7, 7], budget=budget)


def test_stop_completed_at_finds_the_stop_in_the_tail_only():
    ids = [1, 2, 3, 4, 5]
    assert [stop_completed_at(ids, n, STOPS, decode) for n in range(1, 6)] == [
        None,
        None,
        None,
        "</search>",
        "</search>",
    ]
    assert stop_completed_at(ids, 4, [], decode) is None
    assert stop_completed_at([8, 3, 4], 3, STOPS, decode) == "</answer>"  # several: the earliest last occurrence
