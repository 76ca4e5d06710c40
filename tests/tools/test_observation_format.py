"""The Search-R1 observation layout, character for character (docs/searchr1-facts.md §4)."""

from rlinf_ext.assets.searchr1 import trajectories
from rlinf_ext.tools.documents import document_from_row
from rlinf_ext.tools.formatting import CLOSE_TAG, OPEN_TAG, format_documents

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
