"""The real server (uvicorn subprocess on loopback) over the tiny corpus with BM25 and dense indexes."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from rlinf_ext.retrieval.launch import RetrievalServerError, RetrievalServerProcess

pytestmark = pytest.mark.slow  # a server process per fixture and per refusal (~5 s each on 2 cores)

DOC_FIELDS = {"id", "contents", "title", "text"}


def _corpus_rows(path):
    return [json.loads(line) for line in open(path) if line.strip()]


@pytest.fixture(scope="module")
def bm25_server(bm25_index, retrieval_assets, tmp_path_factory):
    addr = tmp_path_factory.mktemp("addr")
    server = RetrievalServerProcess(
        bm25_index, retrieval_assets.corpus, pages=str(retrieval_assets.pages), save_address_to=addr, max_wait_ms=5
    )
    with server as url:
        yield url, server, addr
    assert not list(addr.glob("Host*_IP*.txt")), "address file must be removed on shutdown"


@pytest.fixture(scope="module")
def dense_server(dense_index, retrieval_assets):
    with RetrievalServerProcess(dense_index, retrieval_assets.corpus, max_wait_ms=5, threads=1) as url:
        yield url


@pytest.fixture(scope="module")
def approx_server(build_dense_variant, retrieval_assets):
    """IVF + 4-bit PQ + exact fp16 re-rank, search parameters chosen by the build's audit, memory-mapped."""
    index = build_dense_variant("approx", audit_sample=40)
    with RetrievalServerProcess(index, retrieval_assets.corpus, max_wait_ms=5, threads=1) as url:
        yield url


def _server_url(which, request) -> str:
    url = request.getfixturevalue(f"{which}_server")
    return url[0] if which == "bm25" else url


@pytest.mark.timeout(120)
def test_health_and_address_file(bm25_server, retrieval_assets):
    url, _, addr = bm25_server
    health = httpx.get(f"{url}/health").json()
    n = len(_corpus_rows(retrieval_assets.corpus))
    assert health["status"] == "ok" and health["passages"] == n and health["retriever"] == "bm25"
    assert health["index_type"] == "bm25" and health["batching"] is True and "queue_depth" in health
    assert health["memory_mapped"] is True and health["audit"] is None and health["search_params"] == {}
    assert health["memory"]["rss_mb"] >= health["memory"]["anon_mb"] > 0
    files = list(addr.glob("Host*_IP*.txt"))
    assert len(files) == 1 and "http://" + files[0].read_text() == url
    assert url.startswith("http://127.0.0.1:")


@pytest.mark.timeout(120)
def test_both_response_shapes_field_by_field(bm25_server, retrieval_assets):
    url = bm25_server[0]
    rows = {r["id"]: r for r in _corpus_rows(retrieval_assets.corpus)}
    query = rows["0"]["contents"]
    plain = httpx.post(f"{url}/retrieve", json={"queries": [query, "city"], "topk": 3, "return_scores": False}).json()
    scored = httpx.post(f"{url}/retrieve", json={"queries": [query, "city"], "topk": 3, "return_scores": True}).json()
    assert set(plain) == {"result"} and len(plain["result"]) == 2
    for docs, pairs in zip(plain["result"], scored["result"]):
        assert len(docs) == 3 and len(pairs) == 3
        for doc, pair in zip(docs, pairs):
            assert set(pair) == {"document", "score"} and isinstance(pair["score"], float)
            assert pair["document"] == doc
            source = rows[doc["id"]]
            assert DOC_FIELDS <= set(doc)
            assert doc["contents"] == source["contents"]
            title, text = source["contents"].split("\n", 1)
            assert doc["title"] == title.strip('"') and doc["text"] == text
            if "url" in source:
                assert doc["url"] == source["url"]
        scores = [p["score"] for p in pairs]
        assert scores == sorted(scores, reverse=True)
    assert plain["result"][0][0]["id"] == "0"  # its own text ranks the passage first
    # topk null and omitted both mean the server default (3); return_scores defaults to false.
    for body in ({"queries": ["city"], "topk": None}, {"queries": ["city"]}):
        assert httpx.post(f"{url}/retrieve", json=body).json() == {"result": [plain["result"][1]]}


@pytest.mark.timeout(120)
def test_access_pages(bm25_server, retrieval_assets):
    url = bm25_server[0]
    pages = _corpus_rows(retrieval_assets.pages)
    known = pages[len(pages) // 2]
    r = httpx.post(f"{url}/access", json={"urls": [known["url"], "https://en.wikipedia.org/wiki/No_such"]})
    assert r.status_code == 200 and r.json() == {"result": [known, None]}


BAD_BODIES = [
    (b'{"queries": ["ok"', "not valid JSON"),
    (b'["a"]', "JSON object"),
    (b'{"queries": []}', "queries is empty"),
    (b'{"queries": [""]}', "empty or whitespace"),
    (b'{"queries": ["   "]}', "empty or whitespace"),
    (b'{"queries": [3]}', "valid string"),
    (b'{"queries": "one string"}', "valid list"),
    (b'{"topk": 3}', "queries"),
    (b'{"queries": ["a"], "topk": 0}', "topk=0"),
    (b'{"queries": ["a"], "topk": -2}', "topk=-2"),
    (b'{"queries": ["a"], "topk": 101}', "topk=101"),
    (b'{"queries": ["a"], "topk": "3"}', "valid integer"),
    (b'{"queries": ["a"], "return_scores": "yes"}', "valid boolean"),
    (b'{"queries": ["a"], "query_list": ["b"]}', "Extra inputs"),
    (json.dumps({"queries": ["a"] * 5000}).encode(), "exceeds the limit of 4096"),
    (json.dumps({"queries": ["x" * 5000]}).encode(), "characters"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", ["bm25", "dense"])
@pytest.mark.parametrize("body,message", BAD_BODIES)
def test_bad_input_gets_4xx_with_message_and_server_keeps_serving(which, body, message, request):
    url = _server_url(which, request)
    assert httpx.get(f"{url}/health").json()["memory_mapped"] is True
    r = httpx.post(f"{url}/retrieve", content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert message in r.json()["detail"]
    assert httpx.post(f"{url}/retrieve", json={"queries": ["city"]}).status_code == 200


@pytest.mark.timeout(120)
def test_oversized_body_is_413(bm25_server):
    url = bm25_server[0]
    r = httpx.post(f"{url}/retrieve", content=b'{"queries": ["' + b"a" * (9 << 20) + b'"]}')
    assert r.status_code == 413 and "limit" in r.json()["detail"]
    r = httpx.post(f"{url}/access", content=b'{"urls": [1]}')
    assert r.status_code == 422
    assert httpx.get(f"{url}/health").status_code == 200


async def _concurrent(url, queries, return_scores):
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as client:

        async def one(q):
            r = await client.post(f"{url}/retrieve", json={"queries": [q], "topk": 3, "return_scores": return_scores})
            r.raise_for_status()
            return r.json()["result"][0]

        return await asyncio.gather(*[one(q) for q in queries])


def _queries(corpus, n=64):
    rows = _corpus_rows(corpus)
    return [rows[(i * 7) % len(rows)]["contents"].split("\n", 1)[1][: 20 + i % 40] for i in range(n)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("which", ["bm25", "dense", "approx"])
def test_64_concurrent_clients_get_the_sequential_answers(which, retrieval_assets, request):
    url = _server_url(which, request)
    assert httpx.get(f"{url}/health").json()["memory_mapped"] is True
    queries = _queries(retrieval_assets.corpus)
    sequential = [
        httpx.post(f"{url}/retrieve", json={"queries": [q], "topk": 3, "return_scores": True}).json()["result"][0]
        for q in queries
    ]
    concurrent = asyncio.run(_concurrent(url, queries, True))
    assert [[d["document"]["id"] for d in r] for r in concurrent] == [
        [d["document"]["id"] for d in r] for r in sequential
    ]
    for c, s in zip(concurrent, sequential):
        np.testing.assert_allclose([d["score"] for d in c], [d["score"] for d in s], rtol=1e-5, atol=1e-6)
    # One request holding all 64 queries (Search-R1's pattern) answers the same again.
    batch = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": True}).json()
    assert [[d["document"]["id"] for d in r] for r in batch["result"]] == [
        [d["document"]["id"] for d in r] for r in sequential
    ]
    if which == "bm25":
        assert httpx.get(f"{url}/health").json()["batches_run"] >= 1


@pytest.mark.timeout(120)
def test_dense_top_k_matches_brute_force_numpy(dense_server, dense_index, retrieval_assets):
    from rlinf_ext.retrieval.encoder import EncoderSpec, TextEncoder

    rows = _corpus_rows(retrieval_assets.corpus)
    encoder = TextEncoder(EncoderSpec.for_retriever("e5", str(retrieval_assets.encoder)), threads=1)
    passages = encoder.encode([r["contents"] for r in rows], is_query=False)
    queries = _queries(retrieval_assets.corpus, 8)
    expected = encoder.encode(queries, is_query=True) @ passages.T
    got = httpx.post(f"{dense_server}/retrieve", json={"queries": queries, "topk": 5, "return_scores": True}).json()
    for q_scores, result in zip(expected, got["result"]):
        ids = [int(d["document"]["id"]) for d in result]
        scores = [d["score"] for d in result]
        np.testing.assert_allclose(scores, np.sort(q_scores)[::-1][:5], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(q_scores[ids], scores, rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(120)
def test_no_batching_mode_gives_same_answers(bm25_index, retrieval_assets, bm25_server):
    queries = _queries(retrieval_assets.corpus, 16)
    with RetrievalServerProcess(bm25_index, retrieval_assets.corpus, no_batching=True) as url:
        assert httpx.get(f"{url}/health").json()["batching"] is False
        unbatched = asyncio.run(_concurrent(url, queries, False))
    batched = asyncio.run(_concurrent(bm25_server[0], queries, False))
    assert unbatched == batched


@pytest.mark.timeout(120)
def test_mismatched_corpus_is_refused(bm25_index, tmp_path, retrieval_assets):
    other = tmp_path / "other.jsonl"
    other.write_text(retrieval_assets.corpus.read_text().replace("a", "b", 1))
    with pytest.raises(RetrievalServerError, match="corpus checksum differs"):
        RetrievalServerProcess(bm25_index, other, startup_timeout_s=60).start()


@pytest.mark.timeout(120)
def test_wrong_retriever_and_missing_metadata_are_refused(bm25_index, tmp_path, retrieval_assets):
    with pytest.raises(RetrievalServerError, match="retriever differs: index is 'bm25'"):
        RetrievalServerProcess(bm25_index, retrieval_assets.corpus, retriever="e5", startup_timeout_s=60).start()
    with pytest.raises(RetrievalServerError, match="not a finished index"):
        RetrievalServerProcess(tmp_path, retrieval_assets.corpus, startup_timeout_s=60).start()


@pytest.mark.timeout(120)
def test_health_reports_the_audit_and_search_parameters(approx_server, build_dense_variant):
    from rlinf_ext.retrieval.metadata import IndexMetadata

    meta = IndexMetadata.load(build_dense_variant("approx", audit_sample=40))
    health = httpx.get(f"{approx_server}/health").json()
    assert health["index_type"] == meta.faiss_type and health["memory_mapped"] is True
    assert health["search_params"] == meta.search_params and health["audit"] == meta.audit
    assert {"recall", "k", "latency", "search_params"} <= set(health["audit"])


@pytest.mark.timeout(240)
def test_in_ram_and_serve_time_parameters(build_dense_variant, dense_index, dense_server, retrieval_assets):
    queries = _queries(retrieval_assets.corpus, 16)
    with RetrievalServerProcess(dense_index, retrieval_assets.corpus, in_ram=True, threads=1) as url:
        assert httpx.get(f"{url}/health").json()["memory_mapped"] is False
        body = {"queries": queries, "topk": 5, "return_scores": True}  # one request: the same batch on both
        assert (
            httpx.post(f"{url}/retrieve", json=body).json() == httpx.post(f"{dense_server}/retrieve", json=body).json()
        )
    approx = build_dense_variant("approx", audit_sample=40)
    with RetrievalServerProcess(approx, retrieval_assets.corpus, nprobe=1, k_factor=2, threads=1) as url:
        assert httpx.get(f"{url}/health").json()["search_params"] == {"nprobe": 1, "k_factor_rf": 2}
    with pytest.raises(RetrievalServerError, match=r"efSearch=8 does not apply .*\(it takes: k_factor_rf, nprobe\)"):
        RetrievalServerProcess(approx, retrieval_assets.corpus, ef_search=8, threads=1, startup_timeout_s=120).start()


@pytest.mark.timeout(120)
def test_search_parameters_on_a_bm25_index_are_refused(bm25_index, retrieval_assets):
    with pytest.raises(RetrievalServerError, match=r"search parameters \['nprobe'\] apply to dense"):
        RetrievalServerProcess(bm25_index, retrieval_assets.corpus, nprobe=4, startup_timeout_s=60).start()
