"""Pure ranking pieces: top-k order and the BM25 tokenizer / scores against a hand formula."""

import math

import numpy as np

from rlinf_ext.retrieval.bm25 import BM25Searcher, bm25_tokenize, build_bm25_index
from rlinf_ext.retrieval.corpus import CorpusStore
from rlinf_ext.retrieval.metadata import IndexMetadata
from rlinf_ext.retrieval.searcher import topk_rows


def test_topk_rows_orders_by_score_then_lower_index():
    scores = np.array([0.5, 2.0, 0.5, 3.0, 0.5, 0.1], dtype=np.float32)
    assert topk_rows(scores, 1).tolist() == [3]
    assert topk_rows(scores, 3).tolist() == [3, 1, 0]
    assert topk_rows(scores, 4).tolist() == [3, 1, 0, 2]
    assert topk_rows(scores, 10).tolist() == [3, 1, 0, 2, 4, 5]


def test_bm25_tokenize_hand_cases():
    assert bm25_tokenize("The Eiffel Tower, in PARIS!") == ["eiffel", "tower", "paris"]
    assert bm25_tokenize("a I of") == []


def brute_force_bm25(docs, query, k1=1.5, b=0.75):
    """Lucene BM25 (bm25s' default): idf = ln(1 + (N - df + .5)/(df + .5)), tf/(tf + k1(1 - b + b*dl/avgdl))."""
    toks = [bm25_tokenize(d) for d in docs]
    n, avgdl = len(docs), sum(len(t) for t in toks) / len(docs)
    scores = np.zeros(n)
    for term in bm25_tokenize(query):
        df = sum(term in t for t in toks)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, t in enumerate(toks):
            tf = t.count(term)
            scores[i] += idf * tf / (tf + k1 * (1 - b + b * len(t) / avgdl))
    return scores


def test_bm25_top_k_matches_brute_force(tmp_path):
    import json

    docs = [
        '"Paris"\nParis is the capital of France',
        '"Lyon"\nLyon is a city in France',
        '"Berlin"\nBerlin is the capital of Germany',
        '"Rivers"\nThe Seine flows through Paris Paris',
        '"Empty"\nof the and',
        '"Alps"\nMountains in France and Germany',
    ]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": d}) + "\n" for i, d in enumerate(docs)))
    store = CorpusStore.open(corpus)
    build_bm25_index(store, tmp_path / "idx", show_progress=False)
    searcher = BM25Searcher.load(tmp_path / "idx", IndexMetadata.load(tmp_path / "idx"))
    for query in ["capital of France", "paris", "germany mountains", "unknownword", "France France"]:
        expected = brute_force_bm25(docs, query)
        order = sorted(range(len(docs)), key=lambda i: (-expected[i], i))[:4]
        scores, rows = searcher.search([query], 4)
        assert rows[0].tolist() == order, query
        np.testing.assert_allclose(scores[0], expected[order], rtol=1e-5, atol=1e-6)
    # k above the corpus size is clamped, not an error.
    assert searcher.search(["paris"], 50)[1].shape == (1, len(docs))


def test_bm25_batched_search_equals_per_query_search_with_ties(tmp_path):
    """One batched call (bm25s's numba kernel, 2 threads) answers every query exactly as a call with that query
    alone and as the query's full score vector does, ties included (duplicates, unknown words, one-word queries)."""
    import json

    words = ["paris", "france", "capital", "river", "mountain", "king", "bridge", "city"]
    docs = []
    for i in range(60):
        text = " ".join(words[(i * 3 + j) % len(words)] for j in range(2 + i % 5))
        docs.append(f'"D{i}"\n{text}')
    docs += docs[:12]  # exact duplicates: equal scores for every query
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": d}) + "\n" for i, d in enumerate(docs)))
    build_bm25_index(CorpusStore.open(corpus), tmp_path / "idx", show_progress=False)
    searcher = BM25Searcher.load(tmp_path / "idx", IndexMetadata.load(tmp_path / "idx"), threads=2)
    queries = words + ["paris france", "river river king", "unknownword", "of the", "city bridge mountain paris"]
    for k in (1, 3, 7, len(docs)):
        scores, rows = searcher.search(queries, k)
        for i, q in enumerate(queries):
            one_scores, one_rows = searcher.search([q], k)
            exact_scores, exact_rows = searcher.search_one(searcher.term_ids(q), k)
            assert rows[i].tolist() == one_rows[0].tolist() == exact_rows.tolist(), (q, k)
            assert scores[i].tolist() == one_scores[0].tolist() == exact_scores.tolist(), (q, k)
    # Boundary ties are real in this corpus: a duplicate pair straddles the k-th place for some query.
    full = [searcher.query_scores(searcher.term_ids(q)) for q in queries]
    assert any(np.sort(s)[::-1][2] == np.sort(s)[::-1][3] for s in full)


def test_bm25_batched_equals_per_query_on_the_tiny_corpus(bm25_index, retrieval_assets):
    from rlinf_ext.retrieval.audit import sample_queries

    searcher = BM25Searcher.load(bm25_index, IndexMetadata.load(bm25_index), threads=2)
    queries = sample_queries(CorpusStore.open(retrieval_assets.corpus), 200, seed=3)
    scores, rows = searcher.search(queries, 5)
    for i, q in enumerate(queries):
        one_scores, one_rows = searcher.search([q], 5)
        assert rows[i].tolist() == one_rows[0].tolist() and scores[i].tolist() == one_scores[0].tolist()
