"""Offline text search over the tiny corpus: BM25 (bm25s), standing in for the retrieval server."""

from __future__ import annotations

from pathlib import Path

from rlinf_ext.assets.core.formats import read_jsonl
from rlinf_ext.tools.documents import document_from_row
from rlinf_ext.tools.search import SearchResult


class LexicalRetriever:
    """BM25 over corpus contents (`"Title"\\ntext` strings), as the retrieval server's BM25 index ranks them."""

    def __init__(self, contents: list[str]):
        import bm25s

        self.contents = contents
        self._bm25 = bm25s.BM25()
        self._bm25.index(bm25s.tokenize(contents, stopwords="en", show_progress=False), show_progress=False)

    def search(self, queries: list[str], topk: int = 3) -> list[list[str]]:
        import bm25s

        ids, _ = self._bm25.retrieve(
            bm25s.tokenize(queries, stopwords="en", show_progress=False), k=topk, show_progress=False, n_threads=1
        )
        return [[self.contents[int(i)] for i in row] for row in ids]


def corpus_retriever(corpus_path: Path) -> LexicalRetriever:
    return LexicalRetriever([r["contents"] for r in read_jsonl(corpus_path)])


class CorpusTextSearch:
    """The agent loops' search tool offline: `async search(query)` -> the corpus's BM25 top-k as a `SearchResult`."""

    def __init__(self, retriever: LexicalRetriever, topk: int):
        self.retriever, self.topk = retriever, topk

    async def search(self, query: str) -> SearchResult:
        docs = self.retriever.search([query], self.topk)[0]
        return SearchResult(query=query, ok=True, documents=[document_from_row(d) for d in docs], attempts=1)
