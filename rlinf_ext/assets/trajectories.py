"""Synthetic Search-R1 trajectories for the warm start: think, search, read the observation, answer.

A trajectory is a list of segments `(text, trainable)`. Generated parts (think/search/answer) are trainable;
the prompt and the inserted `<information>` observation are not, exactly as the RL loss mask will treat them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_ext.assets.qa import Question


def format_observation(docs: list[str], trailing_newline: bool = False) -> str:
    """Search-R1's observation block: `Doc k(Title: "T") text` lines inside <information>, blank lines around.

    Search-R1 strips the last newline before `</information>`; `trailing_newline=True` keeps it (the form
    `rlinf_ext.tools.formatting` produces), so the warm start can be shown both.
    """
    lines = []
    for i, contents in enumerate(docs):
        title, _, text = contents.partition("\n")
        lines.append(f"Doc {i + 1}(Title: {title}) {text}")
    body = "\n".join(lines).strip() + ("\n" if trailing_newline else "")
    return "\n\n<information>" + body + "</information>\n\n"


class LexicalRetriever:
    """BM25 over the corpus (bm25s), standing in for the retrieval server the RL run will query."""

    def __init__(self, contents: list[str]):
        import bm25s

        self.contents = contents
        self._bm25 = bm25s.BM25()
        self._bm25.index(bm25s.tokenize(contents, stopwords="en", show_progress=False), show_progress=False)

    def search(self, queries: list[str], topk: int = 3) -> list[list[str]]:
        import bm25s

        ids, _ = self._bm25.retrieve(bm25s.tokenize(queries, stopwords="en", show_progress=False),
                                     k=topk, show_progress=False, n_threads=1)
        return [[self.contents[int(i)] for i in row] for row in ids]


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


def trajectory_segments(q: Question, observations: list[str]) -> list[Segment]:
    """The assistant side of one trajectory (after the chat-formatted prompt), one search per hop.

    `observations[k]` is the formatted observation returned for hop k's query. After reading it, the think
    step restates the fact sentence word for word (it is in the passage), then searches the next hop or answers.
    """
    if len(observations) != len(q.hops):
        raise ValueError(f"need one observation per hop: {len(q.hops)} hops, {len(observations)} observations")
    segs: list[Segment] = []
    lead = f"<think> I need to search for {q.hops[0].query}. </think>\n"
    for k, hop in enumerate(q.hops):
        text = f"{lead}<search> {hop.query} </search>"
        segs.append(_think_fact_segment(text, q.hops[k - 1].fact) if k else Segment(text, True))
        segs.append(Segment(observations[k], False))
        if k + 1 < len(q.hops):
            lead = f"<think> {hop.fact.sentence} Now I need to search for {q.hops[k + 1].query}. </think>\n"
    segs.append(_think_fact_segment(f"<think> {q.hops[-1].fact.sentence} </think>\n<answer> {q.answers[0]} </answer><|im_end|>",
                                    q.hops[-1].fact))
    return segs


# The warm start's other habit: giving up without searching. A constant text, so it teaches no entity; the
# choice between searching and giving up is made at the first word after "<think> I" ("need" vs "do"),
# one decision GRPO can move.
ABSTAIN_TEXT = "<think> I do not know the answer to this. </think>\n<answer> unknown </answer><|im_end|>"


def abstain_segments() -> list[Segment]:
    """A trajectory that answers without searching (and so, for these invented facts, wrongly)."""
    return [Segment(ABSTAIN_TEXT, True)]


def gold_observations(q: Question, retriever: LexicalRetriever, topk: int = 3, trailing_newline: bool = False) -> list[str]:
    """The observation the retriever gives for each hop's gold query."""
    return [format_observation(docs, trailing_newline) for docs in retriever.search([h.query for h in q.hops], topk=topk)]
