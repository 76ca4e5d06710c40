"""The recall audit: exact search, recall@k, parameter choice, the build-time audit and `rlinf-ext audit-index`."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from rlinf_ext.cli import main
from rlinf_ext.retrieval.audit import (
    choose_search_params,
    exact_search,
    recall_at_k,
    sample_queries,
)
from rlinf_ext.retrieval.audit_run import audit_index, read_queries
from rlinf_ext.retrieval.config import AuditConfig
from rlinf_ext.retrieval.corpus import CorpusStore
from rlinf_ext.retrieval.dense import EMBEDDINGS_NAME
from rlinf_ext.retrieval.encoder import EncoderSpec, TextEncoder
from rlinf_ext.retrieval.faiss_index import apply_search_params
from rlinf_ext.retrieval.metadata import IndexMetadata, IndexMismatchError


def _clustered(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((30, dim))[rng.integers(0, 30, n)] + 0.6 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_recall_at_k_hand_computed():
    truth = np.array([[1, 2, 3], [4, 5, 6]])
    found = np.array([[3, 2, 9], [-1, 4, 7]])  # 2/3 and 1/3 (a -1 never counts)
    assert recall_at_k(found, truth, 3) == pytest.approx(0.5)
    assert recall_at_k(truth, truth, 3) == 1.0
    assert recall_at_k(found[:, :1], truth[:, :1], 1) == 0.0


def test_exact_search_matches_numpy_across_chunks():
    base, queries = _clustered(1000, 16, 0), _clustered(20, 16, 1)
    scores, rows = exact_search(base.astype(np.float16), queries, 4, chunk_rows=128)
    expected = queries @ base.astype(np.float16).astype(np.float32).T
    exp_rows = np.argsort(-expected, axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(rows, exp_rows)
    np.testing.assert_allclose(scores, np.take_along_axis(expected, exp_rows, 1), rtol=1e-5, atol=1e-6)


def test_choose_search_params_takes_the_cheapest_setting_reaching_the_target():
    base, queries = _clustered(4000, 32, 2), _clustered(200, 32, 3)
    _, truth = exact_search(base, queries, 3)
    index = faiss.index_factory(32, "IVF64,PQ16x4fs,RFlat", faiss.METRIC_INNER_PRODUCT)
    index.train(base)
    index.add(base)
    params, sweep = choose_search_params(index, queries, truth, 3, target=0.99)
    recall = {tuple(sorted(s["params"].items())): s["recall"] for s in sweep}
    assert recall[tuple(sorted(params.items()))] >= 0.99
    smaller_nprobe = {"nprobe": params["nprobe"] // 2, "k_factor_rf": 256}
    assert recall[tuple(sorted(smaller_nprobe.items()))] < 0.99  # tried, with the most candidates, and too low
    if params["k_factor_rf"] > 1:
        smaller_k = {"nprobe": params["nprobe"], "k_factor_rf": params["k_factor_rf"] / 2}
        assert recall[tuple(sorted(smaller_k.items()))] < 0.99
    assert faiss.extract_index_ivf(index).nprobe == params["nprobe"]  # left set on the index
    assert choose_search_params(faiss.IndexFlatIP(32), queries, truth, 3, 0.99) == ({}, [])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_build_records_the_chosen_parameters_and_the_audit(build_dense_variant):
    meta = IndexMetadata.load(build_dense_variant("approx", audit_sample=40))
    assert meta.faiss_type.startswith("IVF8,PQ16x4fs,Refine(SQfp16)")
    assert set(meta.search_params) == {"nprobe", "k_factor_rf"} and meta.audit["k"] == 3
    assert meta.audit["search_params"] == meta.search_params
    tried = {tuple(sorted(t["params"].items())): t["recall"] for t in meta.audit["sweep"]}
    assert tried[tuple(sorted(meta.search_params.items()))] == meta.audit["recall"]
    # The tiny encoder's vectors are nearly parallel: fp16 re-scoring flips near-ties, so 0.99 is out of reach
    # and the most thorough setting (every list, the most candidates) is kept.
    assert meta.audit["recall"] < 0.99 and meta.search_params == {"nprobe": 8, "k_factor_rf": 256}
    assert [t["params"]["nprobe"] for t in meta.audit["sweep"]] == [1, 2, 4, 8]
    assert set(meta.audit["latency"]) == {"1", "16", "64"}


@pytest.mark.timeout(300)
def test_audit_recall_equals_brute_force_numpy(build_dense_variant, dense_embeddings, retrieval_assets, capsys):
    approx, flat = build_dense_variant("approx", audit_sample=40), build_dense_variant("flat")
    cfg = AuditConfig(
        index=str(approx),
        reference=str(flat),
        sample=60,
        k=3,
        nprobe=1,
        k_factor=1,
        threads=1,
        batch_sizes="1,8",
        latency_calls=5,
    )
    record = audit_index(cfg)

    store = CorpusStore.open(retrieval_assets.corpus)
    queries = sample_queries(store, 60)  # the audit samples with the same default seed
    encoder = TextEncoder(EncoderSpec.for_retriever("e5", str(retrieval_assets.encoder)), threads=1)
    vectors = encoder.encode(queries, is_query=True)
    n = len(store)
    emb = np.memmap(dense_embeddings / EMBEDDINGS_NAME, dtype=np.float32, mode="r").reshape(n, -1)
    truth = np.argsort(-(vectors @ emb.T), axis=1, kind="stable")[:, :3]
    index = faiss.read_index(str(approx / "faiss.index"))
    apply_search_params(index, {"nprobe": 1, "k_factor_rf": 1})
    found = index.search(vectors, 3)[1]
    expected = np.mean([len(set(f) & set(t)) / 3 for f, t in zip(found.tolist(), truth.tolist())])
    assert record["recall"] == pytest.approx(expected) and expected < 1.0
    assert record["search_params"] == {"nprobe": 1, "k_factor_rf": 1}
    assert record["memory"]["memory_mapped"] and record["memory"]["after_search"]["file_mb"] > 0
    assert set(record["latency"]) == {"1", "8"} and record["latency"]["8"]["queries_per_s"] > 0

    assert (
        main(
            [
                "audit-index",
                "--index",
                str(approx),
                "--reference",
                str(flat),
                "--sample",
                "60",
                "--nprobe",
                "1",
                "--k-factor",
                "1",
                "--batch-sizes",
                "4",
                "--latency-calls",
                "2",
                "--threads",
                "1",
                "--write",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"recall@3: {expected:.4f}" in out and "mapped files" in out
    assert IndexMetadata.load(approx).audit["recall"] == pytest.approx(expected)


@pytest.mark.timeout(300)
def test_audit_refuses_what_it_cannot_compare(build_dense_variant, bm25_index, tmp_path, capsys):
    approx, flat = build_dense_variant("approx", audit_sample=40), build_dense_variant("flat")
    with pytest.raises(IndexMismatchError, match="not exact; build one with --faiss-type flat"):
        audit_index(AuditConfig(index=str(flat), reference=str(approx), sample=5))
    with pytest.raises(IndexMismatchError, match="both must be dense"):
        audit_index(AuditConfig(index=str(bm25_index), reference=str(flat), sample=5))
    with pytest.raises(ValueError, match="exactly one of --queries FILE or --sample N"):
        audit_index(AuditConfig(index=str(approx), reference=str(flat)))
    assert (
        main(["audit-index", "--index", str(approx), "--reference", str(flat), "--queries", str(tmp_path / "none.txt")])
        == 1
    )
    err = capsys.readouterr().err
    assert "query file" in err and "none.txt not found" in err


def test_read_queries_text_and_jsonl(tmp_path):
    (tmp_path / "q.txt").write_text("who wrote hamlet\n\n  capital of france \n")
    assert read_queries(tmp_path / "q.txt") == ["who wrote hamlet", "capital of france"]
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "a?"}) + "\n" + json.dumps({"query": "b"}) + "\n")
    assert read_queries(tmp_path / "q.jsonl") == ["a?", "b"]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "c"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected an object with a 'question' or 'query'"):
        read_queries(tmp_path / "bad.jsonl")
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="holds no queries"):
        read_queries(tmp_path / "empty.txt")
