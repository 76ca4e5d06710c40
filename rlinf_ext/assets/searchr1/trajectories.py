"""Planned Search-R1 turns for the warm start: think, search, read the observation, answer.

A turn is a `Segment` (text, trainable, copied spans): what a model that has learned the task writes. The warm
start plays the planned turns back through the real agent loop, which inserts the `<information>` observations
(loss mask 0); `trajectory_segments` interleaves given observations for the tokenizer's training texts and the
warm start's evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_ext.assets.core.search import LexicalRetriever
from rlinf_ext.assets.searchr1.qa import Question
from rlinf_ext.tools.documents import document_from_row
from rlinf_ext.tools.formatting import CLOSE_TAG, OPEN_TAG, format_documents


def format_observation(docs: list[str]) -> str:
    """The observation text the agent loop inserts for corpus contents `docs` (Search-R1's layout,
    `tools.formatting`): `Doc k(Title: "T") text` lines inside <information>, blank lines around."""
    return OPEN_TAG + format_documents([document_from_row(d) for d in docs], "searchr1") + CLOSE_TAG


@dataclass(frozen=True)
class Segment:
    text: str
    trainable: bool
    # character spans of `text` the model must copy out of an observation (the facts' answers): the SFT
    # loss weights their tokens up, since that copy is the one skill the format alone does not teach
    copied: tuple[tuple[int, int], ...] = ()


def _think_fact_segment(text: str, fact) -> Segment:
    """A trainable segment whose text restates `fact`; marks the span of the fact's answer in it."""
    start = text.index(fact.sentence) + len(fact.prefix) + 1
    return Segment(text, True, ((start, start + len(fact.answer)),))


def planned_turns(q: Question) -> list[Segment]:
    """The model's turns of one trajectory (after the chat-formatted prompt), one search per hop, then the answer.

    After reading hop k's observation, the think step restates the fact sentence word for word (it is in the
    passage), then searches the next hop or answers.
    """
    turns: list[Segment] = []
    lead = f"<think> I need to search for {q.hops[0].query}. </think>\n"
    for k, hop in enumerate(q.hops):
        text = f"{lead}<search> {hop.query} </search>"
        turns.append(_think_fact_segment(text, q.hops[k - 1].fact) if k else Segment(text, True))
        if k + 1 < len(q.hops):
            lead = f"<think> {hop.fact.sentence} Now I need to search for {q.hops[k + 1].query}. </think>\n"
    turns.append(
        _think_fact_segment(
            f"<think> {q.hops[-1].fact.sentence} </think>\n<answer> {q.answers[0]} </answer><|im_end|>", q.hops[-1].fact
        )
    )
    return turns


def trajectory_segments(q: Question, observations: list[str]) -> list[Segment]:
    """`planned_turns` with `observations[k]` (hop k's observation text, not trainable) after search turn k."""
    if len(observations) != len(q.hops):
        raise ValueError(f"need one observation per hop: {len(q.hops)} hops, {len(observations)} observations")
    turns, segs = planned_turns(q), []
    for turn, obs in zip(turns, observations):
        segs += [turn, Segment(obs, False)]
    return segs + [turns[-1]]


# Giving up without searching (the registry world's demonstrator, `assets/registry/turns.py`). A constant text, so
# it teaches no entity; the choice between searching and giving up is made at the first word after "<think> I"
# ("need" vs "do"), one decision GRPO can move.
ABSTAIN_TEXT = "<think> I do not know the answer to this. </think>\n<answer> unknown </answer><|im_end|>"


def gold_observations(q: Question, retriever: LexicalRetriever, topk: int = 3) -> list[str]:
    """The observation the retriever gives for each hop's gold query."""
    return [format_observation(docs) for docs in retriever.search([h.query for h in q.hops], topk=topk)]
