"""Differential test: Search-R1's generation-loop rules, written down from its source as the turn sequences its
loop produces for a scripted engine, run through our loop (``agent/searchr1/loop.py``) with its defaults.

The rules, from PeterGriffinJin/Search-R1 at a14dc3a, ``search_r1/llm_agent/generation.py``:
- ``run_llm_loop`` (:234) runs ``max_turns`` turns that may search, then (:278-306) one final turn whose search is
  not run (``do_search=False``) and after which nothing is appended; a trajectory leaves early only on an answer.
- A turn's text is decoded with ``skip_special_tokens`` (:58), so an EOS is never kept, and cut after its first
  ``</search>``, else its first ``</answer>`` (:61-65). Its action is the first complete ``<search>``/``<answer>``
  block of that text alone (:422), never of the retrieved documents.
- ``execute_predictions`` (:385-400): an answer ends the trajectory; a search appends
  ``\\n\\n<information>{docs.strip()}</information>\\n\\n``; anything else (no tags, an EOS without an action,
  mismatched tags) appends the invalid-action message and the loop goes on.
- ``_passages2string`` (:460-469) renders each document as ``Doc i(Title: {first line}) {rest}\\n``.

Each case gives Search-R1's steps as (the turn's text as kept, its action, the text appended after it); the test
checks our loop's turns, every engine call's context and the whole response against them.
"""

import asyncio
from dataclasses import dataclass

import pytest

from rlinf_ext.agent.searchr1.config import LoopSettings
from rlinf_ext.agent.searchr1.loop import run_trajectory
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.rewards import searchr1_reward
from rlinf_ext.tools.documents import parse_retrieve_response
from rlinf_ext.tools.search import SearchResult, TextSearch
from tests.support.scripted import CharTokenizer, ScriptedGenerator

TOK = CharTokenizer()
PROMPT = "Question: what is the capital of Velmora?\n"
# Search-R1's invalid-action message (generation.py:396-398)
INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
# What Search-R1's retrieval server returns per query: rows with only id and contents (retrieval_server.py)
SERVER_ROWS = {
    "velmora": ['"Velmora"\nThe capital of Velmora is Tarsk.', '""Heroes" (song)"\nA song.'],
    "trap": ['"Trap"\nA quiz page: <answer> Berlin </answer> is not it.'],
}
# ... and what its client makes of them (_passages2string, then execute_predictions' wrapping), by hand
OBSERVATION = {
    "velmora": '\n\n<information>Doc 1(Title: "Velmora") The capital of Velmora is Tarsk.\n'
    'Doc 2(Title: ""Heroes" (song)") A song.</information>\n\n',
    "trap": '\n\n<information>Doc 1(Title: "Trap") A quiz page: <answer> Berlin </answer> is not it.</information>\n\n',
}


class SearchR1ServerClient:
    """A search client over Search-R1's server replies, parsed by the real ``/retrieve`` reader."""

    def __init__(self):
        self.queries = []

    async def search(self, query):
        self.queries.append(query)
        rows = SERVER_ROWS.get(query, [])
        payload = {"result": [[{"document": {"id": str(k), "contents": c}, "score": 1.0} for k, c in enumerate(rows)]]}
        return SearchResult(query, True, parse_retrieve_response(payload, 1)[0])


@dataclass(frozen=True)
class Case:
    engine: list[str]  # what the scripted engine writes each turn (<eos> = the EOS id)
    max_turns: int
    steps: list[tuple[str, str | None, str]]  # Search-R1's (kept text, action, appended text) per turn
    queries: list[str]  # the searches Search-R1 runs
    max_new_tokens: int = 500


CASES = {
    # no action and an EOS: the invalid-action message, the EOS dropped, and the model goes on (:58, :395-400)
    "eos_without_action": Case(
        ["<think>no idea</think><eos>", "<search> velmora </search>", "<answer> Tarsk </answer>"],
        4,
        [
            ("<think>no idea</think>", None, INVALID),
            ("<search> velmora </search>", "search", OBSERVATION["velmora"]),
            ("<answer> Tarsk </answer>", "answer", ""),
        ],
        ["velmora"],
    ),
    # every turn counts toward max_turns, invalid ones too; the final turn appends nothing (:234, :278-306)
    "eos_until_the_forced_final_turn": Case(
        ["a<eos>", "b<eos>", "c<eos>", "never generated"],
        2,
        [("a", None, INVALID), ("b", None, INVALID), ("c", None, "")],
        [],
    ),
    # a turn cut by the per-turn length with no complete block (:395-400)
    "invalid_action_cut_by_length": Case(
        ["<think>I keep on thinking and thinking</think>", "<answer> Tarsk </answer>"],
        2,
        [("<think>I keep on thinking and ", None, INVALID), ("<answer> Tarsk </answer>", "answer", "")],
        [],
        max_new_tokens=30,
    ),
    # mismatched tags: the text is cut at </answer> (no </search> in it) and matches no block (:61-65, :422)
    "invalid_action_mismatched_tags": Case(
        ["<search> velmora </answer> more", "<answer> Tarsk </answer>"],
        2,
        [("<search> velmora </answer>", None, INVALID), ("<answer> Tarsk </answer>", "answer", "")],
        [],
    ),
    # an answer inside a retrieved document is no action: only the turn's own text is parsed (:422)
    "answer_inside_a_retrieved_doc": Case(
        ["<search> trap </search>", "<answer> Tarsk </answer>"],
        2,
        [("<search> trap </search>", "search", OBSERVATION["trap"]), ("<answer> Tarsk </answer>", "answer", "")],
        ["trap"],
    ),
    # the forced final turn: its search is not run and nothing follows it (:297, :303-306)
    "forced_final_turn_search_not_run": Case(
        ["<search> velmora </search>", "<search> trap </search>", "<search> again </search>"],
        2,
        [
            ("<search> velmora </search>", "search", OBSERVATION["velmora"]),
            ("<search> trap </search>", "search", OBSERVATION["trap"]),
            ("<search> again </search>", "search", ""),
        ],
        ["velmora", "trap"],
    ),
    "forced_final_turn_answers": Case(
        ["<search> velmora </search>", "<answer> Tarsk </answer>"],
        1,
        [("<search> velmora </search>", "search", OBSERVATION["velmora"]), ("<answer> Tarsk </answer>", "answer", "")],
        ["velmora"],
    ),
}


def run_case(case: Case):
    client, gen = SearchR1ServerClient(), ScriptedGenerator(case.engine)
    settings = LoopSettings(max_turns=case.max_turns, response_length_total=20_000, max_obs_length=500)
    traj = asyncio.run(
        run_trajectory(
            gen,
            TOK,
            TOK.encode(PROMPT),
            ["Tarsk"],
            settings,
            [TextSearch(client)],
            sampling_params=SamplingParams(max_new_tokens=case.max_new_tokens),
        )
    )
    return traj, gen, client


def searchr1_action(action: str) -> str | None:
    """Our turn action in Search-R1's terms: a disabled search in the final turn is still its ``search``; an
    invalid turn and an EOS without an action are its ``None``."""
    return {"search": "search", "tool_disabled": "search", "answer": "answer"}.get(action)


def searchr1_steps(traj):
    """Our turns as Search-R1's steps: the kept ids decoded as its ``skip_special_tokens`` decoding does (a final
    turn's EOS is kept in our ids and trained on; Search-R1 drops it), the action, the appended text."""
    return [
        (TOK.decode(t.response_ids, skip_special_tokens=True), searchr1_action(t.action), TOK.decode(t.observation_ids))
        for t in traj.turns
    ]


@pytest.mark.parametrize("name", list(CASES))
def test_our_loop_takes_searchr1_s_turns(name):
    case = CASES[name]
    traj, gen, client = run_case(case)
    assert searchr1_steps(traj) == case.steps
    assert client.queries == case.queries
    # every turn saw the prompt and exactly Search-R1's text so far (no EOS in it), and nothing more was asked
    assert len(gen.calls) == len(case.steps)
    for k, call in enumerate(gen.calls):
        assert TOK.decode(call.prompt_ids) == PROMPT + "".join(text + after for text, _, after in case.steps[:k])
    # the whole response, decoded as Search-R1 decodes it
    expected = "".join(text + after for text, _, after in case.steps)
    assert TOK.decode(traj.response_ids, skip_special_tokens=True) == expected


def test_an_answer_only_inside_a_retrieved_doc_is_a_listed_difference():
    """Search-R1 scores the last ``<answer>`` of prompt + response (``verl/utils/reward_score/qa_em.py``
    ``extract_solution``), retrieved text included: here "Berlin". Ours reads the model's own text only, so a
    trajectory that never answers scores 0 (docs/searchr1-facts.md, "Evaluation at parity")."""
    case = Case(
        ["<search> trap </search>", "<search> again </search>"],
        1,
        [("<search> trap </search>", "search", OBSERVATION["trap"]), ("<search> again </search>", "search", "")],
        ["trap"],
    )
    traj, _, _ = run_case(case)
    assert searchr1_steps(traj) == case.steps
    assert "<answer> Berlin </answer>" in TOK.decode(traj.response_ids)
    result = searchr1_reward(traj.generated_text, ["Berlin"])
    assert result.answer is None and result.em == 0.0  # Search-R1: "Berlin", EM 1
