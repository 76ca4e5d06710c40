"""Agent loop with a scripted engine: stops, actions, budgets, forced final turn, the loss-mask invariant."""

import asyncio
from dataclasses import replace

import pytest

from rlinf_ext.agent.core.response import check_mask_invariant
from rlinf_ext.agent.searchr1.config import LoopSettings
from rlinf_ext.agent.searchr1.loop import run_group, run_trajectory
from rlinf_ext.agent.searchr1.protocol import SEARCHR1_STOPS, TurnProtocol
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.tools import SearchTool, SearchToolConfig
from rlinf_ext.tools.formatting import CLOSE_TAG, OPEN_TAG
from rlinf_ext.tools.search import TextSearch
from tests.support.scripted import CharTokenizer, ScriptedGenerator

TOK = CharTokenizer()
PROMPT = TOK.encode("Question: capital of France?\n")
CFG = LoopSettings(max_turns=2, response_length_total=2000, max_obs_length=400)
# Search-R1's published invalid-action text (search_r1/llm_agent/generation.py), byte for byte
SEARCHR1_INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


class RecordingClient(SearchTool):
    """The dummy-backend client, recording queries; ok=False turns every result into an HTTP 500 failure."""

    def __init__(self, ok=True):
        super().__init__(SearchToolConfig(backend="dummy", topk=2))
        self.queries, self.ok = [], ok

    async def search(self, query):
        self.queries.append(query)
        result = await super().search(query)
        if not self.ok:
            result.ok, result.documents, result.error = False, [], "HTTP 500"
        return result


class RecordingSearch(TextSearch):
    """The real search tool over a recording client (the client itself has its own tests)."""

    def __init__(self, ok=True):
        super().__init__(RecordingClient(ok))

    @property
    def queries(self):
        return self.client.queries


def run(generator, cfg=CFG, search=None, params=None):
    search = search or RecordingSearch()
    traj = asyncio.run(
        run_trajectory(generator, TOK, PROMPT, ["Paris"], cfg, [search], sampling_params=params or SamplingParams())
    )
    return traj, search


def assert_mask_token_by_token(traj, generator):
    """Walk the response position by position: each id is either the next sampled id (mask 1) or the next
    id of that turn's observation (mask 0), in order, and nothing else."""
    pos = 0
    for turn, call in zip(traj.turns, generator.calls):
        assert turn.response_ids == call.result.output_ids  # kept == sampled
        for token in call.result.output_ids:
            assert traj.response_ids[pos] == token and traj.response_mask[pos] == 1, pos
            pos += 1
        for token in turn.observation_ids:
            assert traj.response_ids[pos] == token and traj.response_mask[pos] == 0, pos
            pos += 1
    assert pos == len(traj.response_ids) == len(traj.response_mask)


def test_parse_action_first_complete_block():
    parse_action = TurnProtocol.of([TextSearch]).parse
    assert parse_action("<think>x</think><search> eiffel </search>", "stop") == ("search", "eiffel")
    assert parse_action("<answer> Paris </answer>", "stop") == ("answer", "Paris")
    assert parse_action("<answer> unclosed <search>q</search>", "stop") == ("search", "q")
    assert parse_action("just text<eos>", "eos") == ("eos", None)
    assert parse_action("just text", "length") == ("invalid", None)


def test_default_tools_give_searchr1_stops_and_published_invalid_action_text():
    protocol = TurnProtocol.of([TextSearch])
    assert protocol.stops == SEARCHR1_STOPS == ("</search>", "</answer>")  # what agent_stops gives for its tools
    assert protocol.invalid_action_message == SEARCHR1_INVALID_ACTION


def test_without_tools_a_search_block_is_no_action():
    protocol = TurnProtocol.of([])
    assert protocol.parse("<search> q </search>", "stop") == ("invalid", None)
    assert protocol.stops == ("</answer>",)


def test_search_then_answer_stops_in_engine_and_masks_observation():
    gen = ScriptedGenerator(
        [
            "<think>need info</think><search> capital of france </search>SHOULD NOT APPEAR",
            "<think>got it</think><answer> Paris </answer>TRAILING",
        ]
    )
    traj, search = run(gen)
    assert search.queries == ["capital of france"]
    # the engine was asked to stop at both closing tags, and stopped there
    assert all({"</search>", "</answer>"} <= set(c.params.stop) for c in gen.calls)
    assert gen.calls[0].result.finish_reason == "stop" and gen.calls[0].result.matched_stop == "</search>"
    assert "SHOULD NOT APPEAR" not in traj.response_text and "TRAILING" not in traj.response_text
    assert [t.action for t in traj.turns] == ["search", "answer"]
    assert traj.end_reason == "answer"
    obs_text = TOK.decode(traj.turns[0].observation_ids)
    assert obs_text.startswith(OPEN_TAG) and obs_text.endswith(CLOSE_TAG)
    assert 'Doc 1(Title: "Dummy' in obs_text
    # second turn saw prompt + turn-1 ids + observation ids, unchanged
    assert gen.calls[1].prompt_ids == PROMPT + gen.calls[0].result.output_ids + traj.turns[0].observation_ids
    assert_mask_token_by_token(traj, gen)
    check_mask_invariant(traj)
    assert traj.metrics["searches"] == 1 and traj.metrics["turns"] == 2
    assert traj.metrics["generated_tokens"] == traj.metrics["kept_tokens"] == sum(traj.response_mask)
    assert traj.metrics["observation_tokens"] == len(traj.turns[0].observation_ids)
    assert traj.rollout_logprobs == [(-0.5 if m else 0.0) for m in traj.response_mask]


def test_loop_adds_required_stops_to_configured_ones():
    gen = ScriptedGenerator(["<answer>Paris</answer>"])
    run(gen, params=SamplingParams(stop=["<|im_end|>"]))
    assert gen.calls[0].params.stop == ["<|im_end|>", "</search>", "</answer>"]


def test_eos_ends_trajectory_and_is_kept_under_on_no_action_end():
    gen = ScriptedGenerator(["<think>I give up</think><eos>"])
    traj, _ = run(gen, cfg=replace(CFG, on_no_action="end"))
    assert traj.end_reason == "eos" and len(gen.calls) == 1
    assert traj.response_ids[-1] == TOK.eos_token_id and traj.response_mask[-1] == 1
    assert_mask_token_by_token(traj, gen)


def test_eos_without_action_is_retried_by_default_without_its_eos_id():
    """Search-R1's rule (the default): the turn is an invalid action; its EOS id is neither kept nor in the next
    turn's context, and everything else of it (ids, log-probs, versions) is."""
    gen = ScriptedGenerator(["<think>I give up</think><eos>", "<answer> Paris </answer>"])
    traj, _ = run(gen)
    first = gen.calls[0].result
    assert [t.action for t in traj.turns] == ["invalid", "answer"] and traj.end_reason == "answer"
    assert traj.turns[0].finish_reason == "eos" and traj.turns[0].response_ids == first.output_ids[:-1]
    assert traj.turns[0].text == "<think>I give up</think>" and traj.turns[0].generated_tokens == len(first.output_ids)
    assert TOK.decode(traj.turns[0].observation_ids) == SEARCHR1_INVALID_ACTION
    assert gen.calls[1].prompt_ids == PROMPT + first.output_ids[:-1] + traj.turns[0].observation_ids
    assert TOK.eos_token_id not in traj.response_ids
    assert traj.metrics["invalid_actions"] == 1
    assert traj.metrics["generated_tokens"] == traj.metrics["kept_tokens"] + 1  # the dropped EOS was generated
    assert traj.rollout_logprobs == [(-0.5 if m else 0.0) for m in traj.response_mask]
    check_mask_invariant(traj)


def test_retried_eos_turn_keeps_per_token_versions_of_its_other_ids():
    class Versioned(ScriptedGenerator):
        def emulate_engine(self, text, params):
            result = super().emulate_engine(text, params)
            return replace(result, weight_version=list(range(len(result.output_ids))))

    gen = Versioned(["ab<eos>", "<answer> Paris </answer>"])
    traj, _ = run(gen)
    assert traj.turns[0].weight_version == [0, 1] and traj.rollout_versions[:2] == [0, 1]
    check_mask_invariant(traj)


def test_on_no_action_must_be_retry_or_end():
    with pytest.raises(ValueError, match="on_no_action must be one of retry, end, got 'again'"):
        LoopSettings(on_no_action="again")


def test_invalid_action_gets_searchr1_message_with_mask_zero():
    gen = ScriptedGenerator(["<think>hmm</think> rambling", "<answer>Paris</answer>"])
    traj, search = run(gen, params=SamplingParams(max_new_tokens=len("<think>hmm</think> rambling")))
    assert traj.turns[0].action == "invalid" and traj.turns[0].finish_reason == "length"
    assert TOK.decode(traj.turns[0].observation_ids) == SEARCHR1_INVALID_ACTION
    assert traj.metrics["invalid_actions"] == 1 and search.queries == []
    assert traj.end_reason == "answer"
    assert_mask_token_by_token(traj, gen)


def test_max_turns_then_forced_final_turn_with_tool_disabled():
    gen = ScriptedGenerator([f"<search> q{k} </search>" for k in range(5)])
    traj, search = run(gen, cfg=replace(CFG, max_turns=2, force_final_answer=True))
    # 2 search turns + 1 final turn whose search is not executed
    assert search.queries == ["q0", "q1"]
    assert [t.action for t in traj.turns] == ["search", "search", "tool_disabled"]
    assert traj.turns[-1].tool == "search" and traj.turns[-1].query == "q2" and traj.turns[-1].tool_ok is None
    assert traj.turns[-1].observation_ids == [] and traj.metrics["searches"] == 2
    assert traj.end_reason == "max_turns"
    assert_mask_token_by_token(traj, gen)


def test_forced_final_turn_can_answer():
    gen = ScriptedGenerator(["<search> a </search>", "<answer>Paris</answer>"])
    traj, _ = run(gen, cfg=replace(CFG, max_turns=1))
    assert [t.action for t in traj.turns] == ["search", "answer"] and traj.end_reason == "answer"


def test_without_forced_final_turn_stops_after_max_turns():
    gen = ScriptedGenerator([f"<search> q{k} </search>" for k in range(5)])
    traj, search = run(gen, cfg=replace(CFG, max_turns=2, force_final_answer=False))
    assert len(gen.calls) == 2 and search.queries == ["q0", "q1"] and traj.end_reason == "max_turns"


def test_invalid_in_final_turn_ends_without_message():
    for on_no_action in ("retry", "end"):  # the final turn ends on EOS either way, and keeps it
        gen = ScriptedGenerator(["blah<eos>"])
        traj, _ = run(gen, cfg=replace(CFG, max_turns=0, on_no_action=on_no_action))
        assert traj.end_reason == "eos" and traj.response_ids[-1] == TOK.eos_token_id
    gen = ScriptedGenerator(["blah"])
    traj, _ = run(gen, cfg=replace(CFG, max_turns=0), params=SamplingParams(max_new_tokens=4))
    assert traj.end_reason == "no_answer_after_final_turn" and traj.turns[0].observation_ids == []


def test_per_turn_max_new_tokens_budget():
    gen = ScriptedGenerator(["x" * 50, "y" * 50, "z" * 50])
    traj, _ = run(gen, cfg=replace(CFG, max_turns=2), params=SamplingParams(max_new_tokens=7))
    assert all(c.params.max_new_tokens == 7 for c in gen.calls)
    assert [len(t.response_ids) for t in traj.turns] == [7, 7, 7]
    assert [t.action for t in traj.turns] == ["invalid", "invalid", "invalid"]


def test_total_response_budget_caps_generation_and_skips_useless_observation():
    turn = "<search> q </search>"
    gen = ScriptedGenerator([turn, turn, turn])
    obs_len = 60
    budget = len(turn) + 10  # room for turn 1, not for its observation plus another token
    traj, search = run(gen, cfg=replace(CFG, response_length_total=budget, max_obs_length=obs_len))
    assert traj.end_reason == "response_budget"
    assert traj.turns[0].observation_ids == [] and len(traj.response_ids) <= budget
    # a bigger budget: the second turn gets only what is left
    budget = len(turn) + obs_len + 5
    gen = ScriptedGenerator([turn, turn, turn])
    traj, _ = run(gen, cfg=replace(CFG, response_length_total=budget, max_obs_length=obs_len))
    assert gen.calls[1].params.max_new_tokens == budget - len(turn) - len(traj.turns[0].observation_ids)
    assert len(traj.response_ids) == budget and traj.end_reason == "response_budget"
    assert_mask_token_by_token(traj, gen)


def test_observation_truncated_by_tokens_keeps_closing_tag():
    gen = ScriptedGenerator(["<search> q </search>", "<answer>Paris</answer>"])
    traj, _ = run(gen, cfg=replace(CFG, max_obs_length=60))
    obs = traj.turns[0].observation_ids
    assert len(obs) == 60
    assert TOK.decode(obs).endswith("</information>\n\n")
    assert traj.metrics["truncated_observations"] == 1


def test_failed_search_inserts_failure_observation_and_counts():
    gen = ScriptedGenerator(["<search> q </search>", "<answer>Paris</answer>"])
    traj, _ = run(gen, search=RecordingSearch(ok=False))
    assert "The search failed (HTTP 500)" in TOK.decode(traj.turns[0].observation_ids)
    assert traj.metrics["search_failures"] == 1 and traj.turns[0].tool_ok is False
    assert traj.end_reason == "answer"


def test_generator_overrunning_budget_is_an_error():
    class Overrun(ScriptedGenerator):
        def emulate_engine(self, text, params):
            result = super().emulate_engine(text, replace(params, max_new_tokens=10_000))
            return result

    with pytest.raises(RuntimeError, match="max_new_tokens"):
        run(Overrun(["x" * 100]), params=SamplingParams(max_new_tokens=5))


def test_run_group_concurrent_shared_uid_and_reward():
    def script(k, context):
        # each trajectory searches once, then answers
        return "<answer>Paris</answer>" if "<information>" in context else "<search> france </search>"

    gen = ScriptedGenerator(script, delay_s=0.01)
    from rlinf_ext.rewards import searchr1_reward

    trajs = asyncio.run(
        run_group(
            gen,
            TOK,
            PROMPT,
            ["Paris"],
            CFG,
            [RecordingSearch()],
            group_size=5,
            uid="g1",
            reward_fn=lambda t: searchr1_reward(t.response_text, t.answers).score,
        )
    )
    assert len(trajs) == 5 and {t.uid for t in trajs} == {"g1"}
    assert all(t.reward == 1.0 and t.end_reason == "answer" for t in trajs)
    for t in trajs:
        check_mask_invariant(t)


def test_the_search_tool_renders_its_client_s_passages_in_its_observation_format():
    """`TextSearch` over any client with `search(query)` (the tiny-asset builder passes its corpus search) renders in
    `tools.search.observation_format`."""
    gen = ScriptedGenerator(["<search> q </search>", "<answer>Paris</answer>"])
    client = RecordingClient()
    traj = asyncio.run(run_trajectory(gen, TOK, PROMPT, ["Paris"], CFG, [TextSearch(client, "rlinf")]))
    assert client.queries == ["q"] and traj.metrics["searches"] == 1
    assert "[Doc 1](" in TOK.decode(traj.turns[0].observation_ids)
