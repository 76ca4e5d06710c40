"""The reading curriculum of the registry warm start: induction sequences, then reading on fresh pairings.

A two-layer model does not discover "find the pair about X, copy what follows" from question-answer trajectories
within any budget this project can spend (measured: a model trained on 38k reading examples copies *a* candidate
and picks the right one at chance). What it learns in a few hundred steps is the induction head on its own:
a random run of names, a random gap, the same run again, the loss on the repeat (its lengths vary, so no fixed
offset solves it). With that head in place, reading the registry (the answer is the token after the subject's
previous occurrence) takes a couple of hundred steps more. Both kinds of example draw their names afresh for
every example, from every name of the world's tokenizer, so nothing can be memorised; no held-out fact's pair is
ever a training target.

The reading examples use the agent's own turns and observation layout (`turns.py`) with the bare question as
the user message (no Search-R1 instruction): short, so that a step is cheap; the trajectory phase then puts the
skill into the full prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlinf_ext.assets.core.sft import SFTExample
from rlinf_ext.assets.registry.turns import answer_turn, search_turn
from rlinf_ext.assets.registry.world import RELATIONS, Fact, Page
from rlinf_ext.assets.searchr1.trajectories import Segment
from rlinf_ext.tools.documents import document_from_row
from rlinf_ext.tools.formatting import build_observation, format_documents

INDUCTION_RUN = (4, 24)  # names in the repeated run
INDUCTION_GAP = (0, 12)  # names between the two copies


def induction_example(rng: random.Random, ids: list[int], forbidden: set[tuple[int, int]]) -> SFTExample:
    """A run of distinct name ids, a gap, the run again; the loss is on the repeat after its first id. No
    adjacent pair of the run is in ``forbidden`` (held-out facts as (subject id, answer id))."""
    while True:
        n, gap = rng.randint(*INDUCTION_RUN), rng.randint(*INDUCTION_GAP)
        drawn = rng.sample(ids, n + gap)
        run, filler = drawn[:n], drawn[n:]
        if not any(pair in forbidden for pair in zip(run, run[1:])):
            return SFTExample(prompt_ids=run + filler + run[:1], response_ids=run[1:], weights=[1.0] * (n - 1))


def segment_ids(tokenizer, segment: Segment, copy_weight: float) -> tuple[list[int], list[float]]:
    """A model turn's ids and loss weights: ``copy_weight`` on tokens of its copied spans, 1 elsewhere."""
    enc = tokenizer(segment.text, add_special_tokens=False, return_offsets_mapping=True)
    weights = [
        copy_weight if any(a < e and b > s for s, e in segment.copied) else 1.0 for a, b in enc["offset_mapping"]
    ]
    return list(enc["input_ids"]), weights


def observation_ids(tokenizer, page: Page) -> list[int]:
    """The observation of ``page`` exactly as the loop builds it (`tools/formatting.build_observation`)."""
    body = format_documents([document_from_row(page.contents)], "searchr1")
    return build_observation(tokenizer, body, None).ids


def short_prompt_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


@dataclass(frozen=True)
class ReadingExample:
    example: SFTExample
    context_ids: list[int]  # prompt, search turn and observation: what the final turn continues
    fact: Fact  # the asked pair
    page: Page

    @property
    def candidates(self) -> tuple[str, ...]:
        return tuple(f.answer for f in self.page.facts)


def reading_example(
    rng: random.Random, tokenizer, names: list[str], forbidden: set[tuple[str, str]], copy_weight: float
) -> ReadingExample:
    """A question about one of three fresh pairs of a random relation, the agent's search turn, a registry page
    of the three pairs (seeded order), and the final turn that restates the asked pair and answers."""
    while True:
        relation = rng.choice(RELATIONS)
        drawn = rng.sample(names, 6)
        facts = tuple(Fact(relation.name, s, a) for s, a in zip(drawn[:3], drawn[3:]))
        if not any((f.subject, f.answer) in forbidden for f in facts):
            break
    page = Page(relation.name, rng.randint(1, 99), facts)
    fact = facts[rng.randrange(len(facts))]
    prompt = short_prompt_ids(tokenizer, relation.question_of(fact.subject))
    search_ids, search_w = segment_ids(tokenizer, search_turn(relation.query_of(fact.subject)), 1.0)
    obs = observation_ids(tokenizer, page)
    answer_ids, answer_w = segment_ids(tokenizer, answer_turn(fact), copy_weight)
    example = SFTExample(
        prompt_ids=prompt, response_ids=search_ids + obs + answer_ids, weights=search_w + [0.0] * len(obs) + answer_w
    )
    return ReadingExample(example, prompt + search_ids + obs, fact, page)
