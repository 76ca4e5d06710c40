"""The Search-R1 observation layout, character for character (docs/searchr1-facts.md §4)."""

from rlinf_ext.assets.searchr1 import trajectories
from rlinf_ext.tools.documents import document_from_row
from rlinf_ext.tools.formatting import CLOSE_TAG, OPEN_TAG, build_observation, format_documents
from tests.support.scripted import CharTokenizer

ROWS = [{"contents": '"Velmora"\nThe capital of Velmora is Tarsk.'}, {"contents": '"Tarsk"\nTarsk is a city.'}]


def test_searchr1_block_has_no_newline_before_closing_tag():
    body = format_documents([document_from_row(r) for r in ROWS], "searchr1")
    assert body == 'Doc 1(Title: "Velmora") The capital of Velmora is Tarsk.\nDoc 2(Title: "Tarsk") Tarsk is a city.'
    assert OPEN_TAG + body + CLOSE_TAG == (
        '\n\n<information>Doc 1(Title: "Velmora") The capital of Velmora is Tarsk.\n'
        'Doc 2(Title: "Tarsk") Tarsk is a city.</information>\n\n'
    )


def test_tool_and_warm_start_observations_agree():
    # the warm start is trained on the layout the RL search tool inserts
    body = format_documents([document_from_row(r) for r in ROWS], "searchr1")
    assert trajectories.format_observation([r["contents"] for r in ROWS]) == OPEN_TAG + body + CLOSE_TAG


def test_rlinf_block_layout():
    body = format_documents([document_from_row({**r, "url": f"u{i}"}) for i, r in enumerate(ROWS)], "rlinf")
    assert body == "[Doc 1](u0):\nThe capital of Velmora is Tarsk.\n\n[Doc 2](u1):\nTarsk is a city.\n"


def test_titles_from_searchr1_s_own_server_keep_their_inner_edge_quotes():
    """Search-R1's server returns only ``contents``; its client shows the title line as stored
    (``generation.py:_passages2string``), so one pair is stripped here and the formatter puts it back."""
    row = {"contents": '""Heroes" (song)"\nA song.'}
    assert format_documents([document_from_row(row)], "searchr1") == 'Doc 1(Title: ""Heroes" (song)") A song.'
    assert document_from_row({"contents": 'Bare "title"\nx'}).title == 'Bare "title"'


class MergingTokenizer(CharTokenizer):
    """One id per character, except that ``>D`` and ``.<`` are one id each: a stand-in for a BPE whose merges
    cross the tag edges, as Qwen2's do (``>Doc``, ``.</``)."""

    MERGES = {">D": 1_000_001, ".<": 1_000_002}

    def encode(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            pair = self.MERGES.get(text[i : i + 2])
            ids.append(pair if pair else ord(text[i]) + 1)
            i += 2 if pair else 1
        return ids

    def decode(self, ids, skip_special_tokens=False):
        back = {v: k for k, v in self.MERGES.items()}
        return "".join(back.get(i) or chr(i - 1) for i in ids)


def test_an_observation_that_fits_is_tokenised_as_one_string_as_searchr1_does():
    tok, body = MergingTokenizer(), 'Doc 1(Title: "T") x.'
    whole = OPEN_TAG + body + CLOSE_TAG
    obs = build_observation(tok, body, 500)
    assert obs.ids == tok.encode(whole) and not obs.truncated  # Search-R1: tokenizer(next_obs) of the whole string
    split = tok.encode(OPEN_TAG) + tok.encode(body) + tok.encode(CLOSE_TAG)
    assert split != obs.ids and len(obs.ids) == len(split) - 2  # the two merges across the tag edges
    # too long: the body is cut in its own tokens and the closing tag survives (a listed difference)
    cut = build_observation(tok, body, len(split) - 3)
    assert cut.truncated and len(cut.ids) == len(split) - 3 and cut.text.endswith(CLOSE_TAG)
