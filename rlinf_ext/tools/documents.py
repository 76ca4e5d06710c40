"""Parse `/retrieve` responses into `Document`s (both response shapes of docs/searchr1-facts.md §2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Document:
    title: str
    text: str
    url: str | None = None
    score: float | None = None
    doc_id: str | None = None


def strip_title_quotes(title: str) -> str:
    """One pair of surrounding double quotes removed (the corpus stores titles as ``"T"``; the formatter puts one
    pair back). Only one: a title such as ``"Heroes" (song)`` keeps its own, as Search-R1's client shows it."""
    return title[1:-1] if len(title) >= 2 and title[0] == title[-1] == '"' else title


def document_from_row(row: Any, score: float | None = None) -> Document:
    """A corpus row -> Document. Search-R1 rows are `{"id", "contents": '"Title"\\ntext'}`; BM25/ASearcher
    rows may also carry `title`, `text`, `url`. A bare string is taken as contents."""
    if isinstance(row, str):
        row = {"contents": row}
    if not isinstance(row, dict):
        raise ValueError(f"retrieval result row must be a dict or a string, got {type(row).__name__}: {row!r}")
    contents = row.get("contents")
    if contents is not None:
        title, _, text = str(contents).partition("\n")
        title = strip_title_quotes(title.strip())
    else:
        title, text = str(row.get("title", "")), str(row.get("text", ""))
    if row.get("title") is not None:
        title = str(row["title"])
    doc_id = row.get("id")
    return Document(
        title=title,
        text=text,
        url=row.get("url"),
        score=score,
        doc_id=None if doc_id is None else str(doc_id),
    )


def parse_retrieve_response(payload: Any, expected_queries: int) -> list[list[Document]]:
    """`{"result": [per_query, ...]}` -> documents per query; items may be rows or `{"document", "score"}`."""
    if not isinstance(payload, dict) or "result" not in payload:
        raise ValueError(f"/retrieve response must be a JSON object with 'result', got {str(payload)[:200]}")
    per_query = payload["result"]
    if not isinstance(per_query, list) or len(per_query) != expected_queries:
        raise ValueError(
            f"/retrieve returned {len(per_query) if isinstance(per_query, list) else type(per_query).__name__} "
            f"result lists for {expected_queries} queries"
        )
    out = []
    for items in per_query:
        docs = []
        for item in items:
            if isinstance(item, dict) and "document" in item:
                docs.append(document_from_row(item["document"], score=item.get("score")))
            else:
                docs.append(document_from_row(item))
        out.append(docs)
    return out
