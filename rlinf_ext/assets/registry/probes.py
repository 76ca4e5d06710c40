"""Probes of a model in the registry world: does it read, and how often does it choose right?

Every probe runs the model through the project's own code: the Search-R1 loop (`agent/searchr1/loop.py`) with the
transformers engine (`generation/hf.py`) and BM25 over the world's corpus, or, for the probes that hold the search
fixed, the agent's own search turn and the loop's observation ids followed by the model's final turn.

- `live` (the RL setting: one search, then the answer): greedy EM; sampled (T = 1) pass@1 and pass@k; the shares
  of sampled answers that are right / another candidate of the subject's page / something else / a give-up; the
  share of the wrong answers (give-ups aside) that are another candidate; how often the right candidate is chosen
  against each distractor.
- `gold_page`: the search turn and the subject's page given; greedy EM of the final turn (reading alone).
- `counterfactual`: the same, with the subject's answer on the page replaced by another answer of the relation;
  the share of final answers that follow the edit.
- `no_observation`: the search turn and an empty result; greedy EM (what the weights alone know: must be ~0 on
  held-out subjects).
- `retrieval_ceiling`: the share of questions whose subject's page is BM25's top result for the agent's query and
  for the raw question.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import asdict, dataclass

from rlinf_ext.agent.searchr1.config import LoopSettings
from rlinf_ext.agent.searchr1.loop import run_trajectory
from rlinf_ext.assets.core.search import CorpusTextSearch, LexicalRetriever
from rlinf_ext.assets.registry.reading import observation_ids, segment_ids
from rlinf_ext.assets.registry.turns import search_turn
from rlinf_ext.assets.registry.world import Fact, Page, Question, RegistryWorld
from rlinf_ext.assets.searchr1.rows import chat_prompt
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.rewards.qa_metrics import extract_answer, normalize_answer
from rlinf_ext.tools.formatting import build_observation
from rlinf_ext.tools.search import TextSearch

RIGHT, OTHER_CANDIDATE, OTHER, GAVE_UP = "right", "other_candidate", "other", "gave_up"
ANSWER_CLASSES = (RIGHT, OTHER_CANDIDATE, OTHER, GAVE_UP)
GIVE_UP_ANSWER = "unknown"
STOPS = ["</search>", "</answer>", "<|im_end|>"]


@dataclass(frozen=True)
class ProbeSettings:
    samples: int = 8  # sampled trajectories per question (pass@k is over these)
    max_new_tokens: int = 48  # per turn
    topk: int = 1  # documents per search, as the tiny experiment's retrieval.topk
    batch_size: int = 64
    seed: int = 0
    max_obs_length: int = 128
    response_length_total: int = 256


def classify_answer(answer: str | None, question: Question, page: Page) -> str:
    """The kind of a final answer: the question's own, another candidate of the subject's page, a give-up, else other."""
    if answer is None:
        return OTHER
    got = normalize_answer(answer)
    if got == normalize_answer(question.answer):
        return RIGHT
    if got == normalize_answer(GIVE_UP_ANSWER):
        return GAVE_UP
    if any(got == normalize_answer(f.answer) for f in page.facts if f.subject != question.subject):
        return OTHER_CANDIDATE
    return OTHER


def edited_page(page: Page, subject: str, new_answer: str) -> Page:
    """``page`` with ``subject``'s answer replaced by ``new_answer`` (everything else as it was)."""
    facts = tuple(Fact(f.relation, f.subject, new_answer) if f.subject == subject else f for f in page.facts)
    return Page(page.relation, page.number, facts)


def counterfactual_answers(world: RegistryWorld, questions: list[Question], seed: int) -> list[str]:
    """For each question, another answer of its relation that is not on the subject's page (seeded)."""
    rng = random.Random(seed)
    by_relation: dict[str, list[str]] = {}
    for f in world.facts:
        by_relation.setdefault(f.relation, []).append(f.answer)
    out = []
    for q in questions:
        on_page = {f.answer for f in world.page_of(q.fact).facts}
        out.append(rng.choice([a for a in by_relation[q.relation] if a not in on_page]))
    return out


def _engine(model, tokenizer, settings: ProbeSettings):
    from rlinf_ext.generation.hf import HFGenerator  # lazy: transformers

    return HFGenerator(model, tokenizer, max_batch_size=settings.batch_size, seed=settings.seed)


def final_turn_answers(
    model, tokenizer, contexts: list[list[int]], settings: ProbeSettings, do_sample: bool = False
) -> list[str | None]:
    """Final turns (greedy, or sampled at T = 1) after each context (ids); the answer of each (None without an
    answer tag)."""
    engine = _engine(model, tokenizer, settings)
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, do_sample=do_sample, stop=list(STOPS))
    out: list[str | None] = []
    for start in range(0, len(contexts), settings.batch_size):
        for result in engine.generate_batch_sync(contexts[start : start + settings.batch_size], params):
            out.append(extract_answer(result.text))
    return out


def search_context(tokenizer, question: Question, page: Page | None) -> list[int]:
    """The full prompt, the agent's search turn and the observation of ``page`` (an empty result when None), in
    the loop's ids."""
    ids = tokenizer.encode(chat_prompt(tokenizer, question.question), add_special_tokens=False)
    ids += segment_ids(tokenizer, search_turn(question.query), 1.0)[0]
    if page is None:  # the loop's observation of a search that returned nothing
        return ids + build_observation(tokenizer, "", None).ids
    return ids + observation_ids(tokenizer, page)


def held_search_probes(
    model, tokenizer, world: RegistryWorld, questions: list[Question], settings: ProbeSettings
) -> dict[str, float]:
    """`gold_page` EM, `counterfactual_follow` and `no_observation` EM (greedy, the search turn given)."""
    pages = [world.page_of(q.fact) for q in questions]
    edits = counterfactual_answers(world, questions, settings.seed)
    gold = final_turn_answers(
        model, tokenizer, [search_context(tokenizer, q, p) for q, p in zip(questions, pages)], settings
    )
    edited = final_turn_answers(
        model,
        tokenizer,
        [search_context(tokenizer, q, edited_page(p, q.subject, e)) for q, p, e in zip(questions, pages, edits)],
        settings,
    )
    empty = final_turn_answers(model, tokenizer, [search_context(tokenizer, q, None) for q in questions], settings)
    n = max(1, len(questions))

    def same(a: str | None, b: str) -> bool:
        return a is not None and normalize_answer(a) == normalize_answer(b)

    return {
        "gold_page_em": sum(same(a, q.answer) for a, q in zip(gold, questions)) / n,
        "counterfactual_follow": sum(same(a, e) for a, e in zip(edited, edits)) / n,
        "counterfactual_kept_true": sum(same(a, q.answer) for a, q in zip(edited, questions)) / n,
        "no_observation_em": sum(same(a, q.answer) for a, q in zip(empty, questions)) / n,
    }


@dataclass(frozen=True)
class LiveOutcome:
    question: Question
    answer_class: str
    searched: bool


def live_outcomes(
    model,
    tokenizer,
    world: RegistryWorld,
    questions: list[Question],
    search,
    settings: ProbeSettings,
    samples: int,
    do_sample: bool,
) -> list[list[LiveOutcome]]:
    """``samples`` trajectories of the real loop per question (one search, then the forced answer), each answer
    classified against the subject's page."""
    engine = _engine(model, tokenizer, settings)
    loop = LoopSettings(
        max_turns=1,
        force_final_answer=True,
        response_length_total=settings.response_length_total,
        max_obs_length=settings.max_obs_length,
    )
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, do_sample=do_sample, stop=list(STOPS))
    tools = [TextSearch(search)]

    async def one(q: Question) -> list:
        prompt = tokenizer.encode(chat_prompt(tokenizer, q.question), add_special_tokens=False)
        return await asyncio.gather(
            *(
                run_trajectory(engine, tokenizer, prompt, [q.answer], loop, tools, sampling_params=params)
                for _ in range(samples)
            )
        )

    async def every() -> list:
        return await asyncio.gather(*(one(q) for q in questions))

    return [
        [
            LiveOutcome(
                q,
                classify_answer(extract_answer(t.response_text), q, world.page_of(q.fact)),
                any(turn.action == "search" for turn in t.turns),
            )
            for t in trajs
        ]
        for q, trajs in zip(questions, asyncio.run(every()))
    ]


def live_probes(
    model,
    tokenizer,
    world: RegistryWorld,
    questions: list[Question],
    retriever: LexicalRetriever,
    settings: ProbeSettings,
) -> dict[str, float]:
    """Greedy EM, sampled pass@1 / pass@k, the answer shares and the choice ratio (see the module docstring)."""
    search = CorpusTextSearch(retriever, settings.topk)
    greedy = live_outcomes(model, tokenizer, world, questions, search, settings, 1, do_sample=False)
    sampled = live_outcomes(model, tokenizer, world, questions, search, settings, settings.samples, do_sample=True)
    return {
        "greedy_em": _share(greedy, RIGHT),
        **sampled_figures(sampled),
        "greedy_search_rate": sum(o.searched for row in greedy for o in row) / max(1, len(greedy)),
    }


def sampled_figures(rows: list[list[LiveOutcome]]) -> dict[str, float]:
    """pass@1, pass@k, answer shares, the search rate, the share of the wrong answers (give-ups aside: those are
    the other choice) that are another candidate of the page, and right / (other candidates / 2): how much more
    often the right candidate is chosen than each distractor."""
    flat = [o for row in rows for o in row]
    counts = Counter(o.answer_class for o in flat)
    n = max(1, len(flat))
    wrong = counts[OTHER_CANDIDATE] + counts[OTHER]
    return {
        "pass@1": counts[RIGHT] / n,
        f"pass@{max((len(r) for r in rows), default=0)}": sum(any(o.answer_class == RIGHT for o in r) for r in rows)
        / max(1, len(rows)),
        **{f"share_{c}": counts[c] / n for c in ANSWER_CLASSES},
        "search_rate": sum(o.searched for o in flat) / n,
        "wrong_that_are_candidates": counts[OTHER_CANDIDATE] / wrong if wrong else 0.0,
        "right_vs_each_distractor": (
            counts[RIGHT] / (counts[OTHER_CANDIDATE] / 2)
            if counts[OTHER_CANDIDATE]
            else float("inf")
            if counts[RIGHT]
            else 0.0
        ),
    }


def _share(rows: list[list[LiveOutcome]], kind: str) -> float:
    flat = [o for row in rows for o in row]
    return sum(o.answer_class == kind for o in flat) / max(1, len(flat))


def retrieval_ceiling(world: RegistryWorld, questions: list[Question], retriever: LexicalRetriever) -> dict[str, float]:
    """Share of questions whose subject's page is the top BM25 result for the agent's query / the raw question."""
    n = max(1, len(questions))
    out = {}
    for name, texts in (("query", [q.query for q in questions]), ("question", [q.question for q in questions])):
        tops = retriever.search(texts, topk=1)
        out[f"retrieval_top1_{name}"] = (
            sum(top[0] == world.page_of(q.fact).contents for top, q in zip(tops, questions)) / n
        )
    return out


def probe_all(
    model,
    tokenizer,
    world: RegistryWorld,
    questions: list[Question],
    retriever: LexicalRetriever,
    settings: ProbeSettings = ProbeSettings(),
) -> dict[str, float]:
    """Every probe above on ``questions`` (the warm start's gate; the learning benchmark after RL)."""
    return {
        **live_probes(model, tokenizer, world, questions, retriever, settings),
        **held_search_probes(model, tokenizer, world, questions, settings),
        "questions": float(len(questions)),
        "samples": float(settings.samples),
    }


def settings_dict(settings: ProbeSettings) -> dict:
    return asdict(settings)
