"""`adopt-index` over Search-R1's published formats (generated offline by retrieval/published_fixtures.py): the
adopted index answers like a built one, is memory-mapped through a link, and every malformed download is refused
with the problem and the fix."""

from __future__ import annotations

import json
import shutil

import faiss
import httpx
import numpy as np
import pytest

from rlinf_ext.cli import main as cli
from rlinf_ext.retrieval.adopt import (
    ADOPT_CHECK,
    ADOPTED_FROM,
    CHECK_RANK1,
    CHECK_ROWS,
    AdoptError,
    adopt_index,
    check_rows,
)
from rlinf_ext.retrieval.audit import AUDIT_RECALL, recall_at_k, sample_queries
from rlinf_ext.retrieval.config import AdoptConfig, ServerConfig
from rlinf_ext.retrieval.corpus import CorpusStore
from rlinf_ext.retrieval.faiss_index import FAISS_NAME
from rlinf_ext.retrieval.metadata import METADATA_NAME, IndexMismatchError
from rlinf_ext.retrieval.open import open_searcher
from rlinf_ext.retrieval.published_fixtures import read_contents, write_bare_index, write_wiki18_gz
from rlinf_ext.retrieval.server import open_backend


def _config(pub, out, **overrides) -> AdoptConfig:
    args = {
        "faiss": pub.flat_index,
        "corpus": pub.corpus_gz,
        "retriever": "e5",
        "model": pub.encoder,
        "out": out,
        "device": "cpu",
        "threads": 1,
        **overrides,
    }
    return AdoptConfig(**{k: str(v) if k in ("faiss", "corpus", "model", "out") else v for k, v in args.items()})


def _cli_adopt(pub, out, capsys, **kw) -> str:
    cfg = _config(pub, out, **kw)
    argv = [
        "adopt-index",
        "--faiss",
        cfg.faiss,
        "--corpus",
        cfg.corpus,
        "--retriever",
        cfg.retriever,
        "--model",
        cfg.model,
        "--out",
        cfg.out,
        "--device",
        "cpu",
        "--threads",
        "1",
    ]
    assert cli(argv) == 1
    assert not (out / METADATA_NAME).exists()  # nothing servable is left behind
    return capsys.readouterr().err


@pytest.fixture(scope="module")
def adopted_flat(published_retrieval, tmp_path_factory):
    out = tmp_path_factory.mktemp("adopted_flat")
    adopt_index(_config(published_retrieval, out), show_progress=False)
    return out


@pytest.mark.timeout(300)
def test_adopted_flat_gives_the_top_k_of_a_built_index_on_200_queries(
    adopted_flat, dense_index, published_retrieval, retrieval_assets
):
    adopted, meta = open_searcher(adopted_flat, threads=1)
    built, _ = open_searcher(dense_index, threads=1)
    # the same vectors: Search-R1's recipe (fixture) and build-index's encoder agree on every passage
    n = meta.passages
    np.testing.assert_allclose(adopted.index.reconstruct_n(0, n), built.index.reconstruct_n(0, n), atol=1e-5)
    store = CorpusStore.open(retrieval_assets.corpus)
    queries = sample_queries(store, 200, seed=1)
    for k in (1, 3, 10):
        s_adopted, r_adopted = adopted.search(queries, k)
        s_built, r_built = built.search(queries, k)
        np.testing.assert_array_equal(r_adopted, r_built)
        np.testing.assert_allclose(s_adopted, s_built, atol=1e-5)
    # memory-mapped through the link: the process maps the downloaded file itself, nothing was copied
    assert adopted.memory_mapped
    assert (adopted_flat / FAISS_NAME).is_symlink()
    assert (adopted_flat / FAISS_NAME).resolve() == published_retrieval.flat_index.resolve()
    with open("/proc/self/maps") as f:
        assert str(published_retrieval.flat_index.resolve()) in f.read()
    assert meta.faiss_type == "Flat" and meta.passages == len(store) and meta.dim == 32
    assert meta.extra[ADOPTED_FROM] == str(published_retrieval.flat_index.resolve())
    assert meta.extra[ADOPT_CHECK][CHECK_RANK1] == len(meta.extra[ADOPT_CHECK][CHECK_ROWS]) == 16
    assert meta.corpus_path == str(published_retrieval.corpus.resolve())  # the .gz was unpacked once, beside it


def test_check_rows_spread_over_the_corpus_with_both_ends():
    assert check_rows(328, 5).tolist() == [0, 82, 164, 245, 327]
    assert check_rows(3, 16).tolist() == [0, 1, 2]
    assert check_rows(0, 16).tolist() == []


@pytest.mark.timeout(120)
def test_truncated_index_is_refused_naming_the_fix(published_retrieval, tmp_path, capsys):
    cut = tmp_path / "e5_Flat.index"
    cut.write_bytes(published_retrieval.flat_index.read_bytes()[:-1000])
    err = _cli_adopt(published_retrieval, tmp_path / "out", capsys, faiss=cut)
    assert "is truncated or not a faiss index" in err and "download.py" in err and "cat part_aa part_ab" in err


@pytest.mark.timeout(120)
def test_wrong_dimension_is_refused_naming_the_encoder(published_retrieval, tmp_path, capsys):
    rows = len(read_contents(published_retrieval.corpus))
    vectors = np.random.default_rng(0).standard_normal((rows, 16)).astype(np.float32)
    index = write_bare_index(vectors, tmp_path / "e5_Flat.index")
    err = _cli_adopt(published_retrieval, tmp_path / "out", capsys, faiss=index)
    assert "its vectors are 16-d but the encoder" in err and "gives 32-d vectors" in err
    assert "pass the encoder the index was built with (--model" in err


@pytest.mark.timeout(120)
def test_corpus_rows_unequal_to_ntotal_are_refused_naming_the_corpus(published_retrieval, tmp_path, capsys):
    contents = read_contents(published_retrieval.corpus)
    short = write_wiki18_gz(contents[:-1], tmp_path / "wiki-18.jsonl.gz")
    err = _cli_adopt(published_retrieval, tmp_path / "out", capsys, corpus=short)
    assert f"it holds {len(contents)} vectors but the corpus" in err and f"has {len(contents) - 1} rows" in err
    assert "pass the corpus the index was built over" in err


@pytest.mark.timeout(120)
def test_a_corpus_in_another_order_fails_the_rank_one_check(published_retrieval, tmp_path):
    contents = read_contents(published_retrieval.corpus)
    reordered = write_wiki18_gz(contents[1:] + contents[:1], tmp_path / "wiki-18.jsonl.gz")  # shifted by one row
    with pytest.raises(AdoptError) as e:
        adopt_index(_config(published_retrieval, tmp_path / "out", corpus=reordered), show_progress=False)
    text = str(e.value)
    assert "sampled passages re-encoded with" in text and "do not come back at rank 1" in text
    assert "row 0 (" in text and "not in the order the index was built in" in text


@pytest.mark.timeout(120)
def test_metric_type_and_lucene_are_refused(published_retrieval, tmp_path):
    vectors = faiss.read_index(str(published_retrieval.flat_index)).reconstruct_n(0, 328)
    l2 = tmp_path / "l2.index"
    index = faiss.IndexFlatL2(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(l2))
    with pytest.raises(AdoptError, match="its metric is not inner product"):
        adopt_index(_config(published_retrieval, tmp_path / "a", faiss=l2), show_progress=False)
    sq = write_bare_index(vectors, tmp_path / "sq.index", "SQfp16")
    with pytest.raises(AdoptError, match="it is a IndexScalarQuantizer; adopt-index takes Flat and HNSW"):
        adopt_index(_config(published_retrieval, tmp_path / "b", faiss=sq), show_progress=False)
    lucene = tmp_path / "bm25"
    lucene.mkdir()
    (lucene / "segments_1").write_bytes(b"\0")
    with pytest.raises(AdoptError, match=r"Lucene index .*build-index --retriever bm25"):
        adopt_index(_config(published_retrieval, tmp_path / "c", faiss=lucene), show_progress=False)
    (tmp_path / "part_aa").write_bytes(b"\0")
    with pytest.raises(AdoptError, match=r"file not found .*cat part_\* > e5_Flat.index"):
        adopt_index(_config(published_retrieval, tmp_path / "d", faiss=tmp_path / "e5_Flat.index"), show_progress=False)


@pytest.mark.timeout(300)
def test_adopted_hnsw64_gets_an_audited_ef_search(published_retrieval, adopted_flat, tmp_path):
    meta = adopt_index(
        _config(published_retrieval, tmp_path, faiss=published_retrieval.hnsw_index, audit_sample=100),
        show_progress=False,
    )
    assert meta.faiss_type == "HNSW64" and "efSearch" in meta.search_params
    assert meta.audit[AUDIT_RECALL] >= 0.99
    hnsw, _ = open_searcher(tmp_path, threads=1)
    flat, _ = open_searcher(adopted_flat, threads=1)
    assert hnsw.memory_mapped and hnsw.search_params == meta.search_params
    queries = sample_queries(CorpusStore.open(published_retrieval.corpus), 200, seed=2)  # not the audit's queries
    assert recall_at_k(hnsw.search(queries, 3)[1], flat.search(queries, 3)[1], 3) >= 0.95


@pytest.mark.timeout(120)
def test_a_replaced_or_moved_target_is_refused_when_served(published_retrieval, tmp_path):
    own = tmp_path / "e5_Flat.index"
    shutil.copy(published_retrieval.flat_index, own)
    out = tmp_path / "adopted"
    adopt_index(_config(published_retrieval, out, faiss=own), show_progress=False)
    shutil.copy(published_retrieval.hnsw_index, own)  # another file under the same name
    with pytest.raises(IndexMismatchError, match="size/checksum differ.*rerun `rlinf-ext adopt-index`"):
        open_searcher(out, threads=1)
    own.unlink()
    with pytest.raises(IndexMismatchError, match=f"it links to {own}, which is missing"):
        open_searcher(out, threads=1)


@pytest.mark.timeout(120)
def test_asearcher_corpus_with_urls_is_adopted_and_served_with_them(published_retrieval, retrieval_assets, tmp_path):
    """The tiny corpus has ASearcher's row form (id, contents, url): its rows are the ones the index was built over."""
    first = json.loads(retrieval_assets.corpus.read_text().splitlines()[0])
    assert set(first) == {"id", "contents", "url"}
    adopt_index(_config(published_retrieval, tmp_path, corpus=retrieval_assets.corpus), show_progress=False)
    backend = open_backend(
        ServerConfig(index=str(tmp_path), corpus=str(retrieval_assets.corpus), device="cpu", threads=1)
    )
    _, rows = backend.searcher.search([first["contents"]], 1)
    doc = backend.store.get(int(rows[0, 0]))
    assert doc["url"] == first["url"] and doc["id"] == "0"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_server_serves_the_adopted_index_from_the_gz_corpus(adopted_flat, published_retrieval):
    from rlinf_ext.retrieval.launch import RetrievalServerProcess

    first = read_contents(published_retrieval.corpus)[0]
    with RetrievalServerProcess(adopted_flat, published_retrieval.corpus_gz, threads=1, startup_timeout_s=150) as url:
        health = httpx.get(f"{url}/health").json()
        assert health["memory_mapped"] and health["index_type"] == "Flat" and health["retriever"] == "e5"
        body = httpx.post(f"{url}/retrieve", json={"queries": [first], "topk": 2, "return_scores": True}).json()
    doc = body["result"][0][0]["document"]
    assert doc["id"] == "0" and doc["contents"] == first and doc["title"] == first.split("\n")[0].strip('"')
