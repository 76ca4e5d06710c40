"""Index building: resumable dense build, metadata checks, and the CLI verbs."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from rlinf_ext.cli import main
from rlinf_ext.retrieval.corpus import CorpusStore, file_fingerprint
from rlinf_ext.retrieval.dense import (
    EMBEDDINGS_NAME,
    FAISS_NAME,
    PROGRESS_NAME,
    build_dense_index,
)
from rlinf_ext.retrieval.encoder import EncoderSpec, pool
from rlinf_ext.retrieval.metadata import (
    IndexMetadata,
    IndexMismatchError,
    check_matches,
)


class _Interrupt(Exception):
    pass


def test_pooling_hand_computed():
    import torch

    hidden = torch.tensor([[[3.0, 0.0], [0.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    # mean of the two unmasked tokens = (1.5, 2) -> normalised (0.6, 0.8); cls = first token -> (1, 0)
    assert torch.allclose(pool(hidden, mask, "mean"), torch.tensor([[0.6, 0.8]]))
    assert torch.allclose(pool(hidden, mask, "cls"), torch.tensor([[1.0, 0.0]]))


def test_encoder_spec_defaults_follow_the_retriever():
    e5 = EncoderSpec.for_retriever("e5", "m")
    assert (e5.pooling, e5.query_prefix, e5.passage_prefix, e5.max_length) == ("mean", "query: ", "passage: ", 256)
    bge = EncoderSpec.for_retriever("bge", "m")
    assert bge.pooling == "cls" and bge.query_prefix.startswith("Represent this sentence")
    with pytest.raises(ValueError, match="unknown dense retriever"):
        EncoderSpec.for_retriever("colbert", "m")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_interrupted_dense_build_resumes_from_the_embedding_memmap(retrieval_assets, tmp_path):
    store = CorpusStore.open(retrieval_assets.corpus)
    spec = EncoderSpec.for_retriever("e5", str(retrieval_assets.encoder))
    out = tmp_path / "idx"

    def interrupt_after_first_chunk(rows_done):
        raise _Interrupt(rows_done)

    with pytest.raises(_Interrupt):
        build_dense_index(
            store,
            out,
            spec,
            batch_size=16,
            device="cpu",
            chunk_rows=100,
            threads=1,
            on_chunk=interrupt_after_first_chunk,
            show_progress=False,
        )
    assert json.loads((out / PROGRESS_NAME).read_text())["rows_done"] == 100
    assert not (out / "index_meta.json").exists()  # unfinished index has no metadata
    with pytest.raises(IndexMismatchError, match="not a finished index"):
        IndexMetadata.load(out)

    seen = []
    meta = build_dense_index(
        store,
        out,
        spec,
        batch_size=16,
        device="cpu",
        chunk_rows=100,
        threads=1,
        on_chunk=seen.append,
        keep_embeddings=True,
        show_progress=False,
    )
    n = len(store)
    assert seen[0] == min(200, n) and seen[-1] == n  # the first 100 rows were not encoded again
    resumed = np.memmap(out / EMBEDDINGS_NAME, dtype=np.float32, mode="r", shape=(n, meta.dim))

    fresh_dir = tmp_path / "fresh"
    build_dense_index(
        store,
        fresh_dir,
        spec,
        batch_size=16,
        device="cpu",
        chunk_rows=100,
        threads=1,
        keep_embeddings=True,
        show_progress=False,
    )
    fresh = np.memmap(fresh_dir / EMBEDDINGS_NAME, dtype=np.float32, mode="r", shape=(n, meta.dim))
    np.testing.assert_allclose(resumed, fresh, atol=1e-6)
    assert faiss.read_index(str(out / FAISS_NAME)).ntotal == n
    assert meta.passages == n and meta.faiss_type == "Flat" and meta.pooling == "mean"
    assert meta.corpus_checksum == file_fingerprint(retrieval_assets.corpus)


def test_check_matches_names_every_difference():
    meta = IndexMetadata(
        retriever="e5",
        corpus_path="/c",
        corpus_size=1,
        corpus_checksum="A",
        passages=10,
        model="/m",
        model_checksum="M",
    )
    check_matches(meta, corpus_checksum="A", passages=10, retriever="e5", model_checksum="M")
    with pytest.raises(IndexMismatchError) as e:
        check_matches(meta, corpus_checksum="B", passages=11, retriever="bm25", model_checksum="N")
    text = str(e.value)
    for part in ("corpus checksum differs", "passage count differs", "retriever differs", "encoder differs"):
        assert part in text


@pytest.mark.timeout(120)
def test_cli_build_index_bm25_and_errors(retrieval_assets, tmp_path, capsys):
    out = tmp_path / "bm25"
    assert main(["build-index", "--corpus", str(retrieval_assets.corpus), "--out", str(out)]) == 0
    assert IndexMetadata.load(out).retriever == "bm25"
    assert (
        main(
            ["build-index", "--corpus", str(retrieval_assets.corpus), "--out", str(tmp_path / "d"), "--retriever", "e5"]
        )
        == 1
    )
    assert "needs --model" in capsys.readouterr().err
    assert main(["build-index", "--corpus", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x")]) == 1
    assert "corpus file not found" in capsys.readouterr().err
    assert (
        main(
            [
                "build-index",
                "--corpus",
                str(retrieval_assets.corpus),
                "--out",
                str(tmp_path / "f"),
                "--retriever",
                "e5",
                "--model",
                str(retrieval_assets.encoder),
                "--faiss-type",
                "Bogus7",
                "--threads",
                "1",
            ]
        )
        == 1
    )
    assert "faiss cannot build 'Bogus7'" in capsys.readouterr().err


@pytest.mark.slow
def test_dense_searcher_batches_through_one_blas_product_with_unchanged_answers(dense_index):
    """Loading a dense index lowers faiss's BLAS threshold (faiss 1.15 scans the index once per query below
    128000 / dim queries); a batch must still rank exactly as one-query calls do."""
    from rlinf_ext.retrieval.dense import FLAT_BLAS_THRESHOLD
    from rlinf_ext.retrieval.open import open_searcher

    before = faiss.cvar.distance_compute_blas_threshold
    try:
        faiss.cvar.distance_compute_blas_threshold = 128000
        searcher, _ = open_searcher(dense_index, threads=1)
        assert faiss.cvar.distance_compute_blas_threshold == FLAT_BLAS_THRESHOLD
        queries = [f"city river founded {i}" for i in range(40)] + ["capital", "sea of"]
        scores, rows = searcher.search(queries, 3)
        for i, q in enumerate(queries):
            s1, r1 = searcher.search([q], 3)
            assert r1[0].tolist() == rows[i].tolist(), q
            assert np.allclose(s1[0], scores[i], atol=1e-5)
    finally:
        faiss.cvar.distance_compute_blas_threshold = before
