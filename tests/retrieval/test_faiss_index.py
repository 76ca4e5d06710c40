"""faiss index files: memory-mapped vs in-RAM, refused files, search parameters, exact re-rank, fp16 Flat."""

from __future__ import annotations

import shutil

import faiss
import numpy as np
import pytest

from rlinf_ext.retrieval.dense import open_faiss_index
from rlinf_ext.retrieval.faiss_index import (
    FAISS_NAME,
    apply_search_params,
    ivf_lists,
    read_faiss_index,
    resolve_faiss_type,
    tunable_params,
)
from rlinf_ext.retrieval.metadata import IndexMetadata, IndexMismatchError
from rlinf_ext.retrieval.open import open_searcher

QUERIES = ["city river founded", "capital of the", "mountain king", "sea", "old bridge north", "university"]


def _mapped_files() -> str:
    with open("/proc/self/maps") as f:
        return f.read()


def _clustered(n: int, dim: int, seed: int, clusters: int = 40) -> np.ndarray:
    """Unit vectors around ``clusters`` random centres (like text embeddings: neighbours share a cluster)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim))
    x = centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _numpy_top_k(queries: np.ndarray, base: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = queries @ base.T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, rows, axis=1), rows


@pytest.mark.timeout(300)
@pytest.mark.parametrize("faiss_type", ["flat", "flat-fp16", "HNSW16", "approx"])
def test_mapped_and_in_ram_indexes_return_identical_results(build_dense_variant, faiss_type):
    index_dir = build_dense_variant(faiss_type, audit_sample=40 if faiss_type == "approx" else 0)
    path = str((index_dir / FAISS_NAME).resolve())
    mapped, _ = open_searcher(index_dir, threads=1)
    assert mapped.memory_mapped and path in _mapped_files()  # a view of the file, not a copy
    del mapped.index
    in_ram, _ = open_searcher(index_dir, threads=1, in_ram=True)
    assert not in_ram.memory_mapped and path not in _mapped_files()
    mapped, _ = open_searcher(index_dir, threads=1)
    for k in (1, 3, 10):
        s_map, r_map = mapped.search(QUERIES, k)
        s_ram, r_ram = in_ram.search(QUERIES, k)
        np.testing.assert_array_equal(r_map, r_ram)
        np.testing.assert_array_equal(s_map, s_ram)


def test_presets_resolve_to_factory_strings():
    assert resolve_faiss_type("flat", 1000, 768) == "Flat"
    assert resolve_faiss_type("flat-fp16", 1000, 768) == "SQfp16"
    assert resolve_faiss_type("approx", 1_000_000, 768) == "IVF2048,PQ384x4fs,Refine(SQfp16)"
    assert resolve_faiss_type("HNSW32", 1000, 768) == "HNSW32"
    # 2*sqrt(N) rounded to a power of two, at most N/39 (faiss's training minimum per list)
    assert (ivf_lists(1_000_000), ivf_lists(21_015_324), ivf_lists(300), ivf_lists(10)) == (2048, 8192, 8, 1)


def test_fp16_flat_is_exact_over_fp16_vectors_and_close_to_fp32():
    base, queries = _clustered(5000, 64, seed=0), _clustered(200, 64, seed=1)
    index = faiss.index_factory(64, "SQfp16", faiss.METRIC_INNER_PRODUCT)
    index.train(base)
    index.add(base)
    scores, rows = index.search(queries, 3)
    exp_scores, exp_rows = _numpy_top_k(queries, base.astype(np.float16).astype(np.float32), 3)
    np.testing.assert_array_equal(rows, exp_rows)
    np.testing.assert_allclose(scores, exp_scores, rtol=1e-5, atol=1e-5)
    _, fp32_rows = _numpy_top_k(queries, base, 3)
    hits = sum(len(set(a) & set(b)) for a, b in zip(rows.tolist(), fp32_rows.tolist()))
    assert hits / fp32_rows.size >= 0.999


@pytest.fixture
def flat_copy(build_dense_variant, tmp_path):
    src = build_dense_variant("flat")
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def test_truncated_index_file_is_refused_naming_the_file(flat_copy):
    path = flat_copy / FAISS_NAME
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(IndexMismatchError, match="truncated or another index") as e:
        open_searcher(flat_copy, threads=1)
    assert str(path) in str(e.value) and "build-index" in str(e.value)
    meta = IndexMetadata.load(flat_copy)  # an index built before checksums were recorded: faiss's read fails
    meta.faiss_checksum = None
    meta.save(flat_copy)
    for in_ram in (False, True):
        with pytest.raises(IndexMismatchError, match="not a readable faiss index") as e:
            open_searcher(flat_copy, threads=1, in_ram=in_ram)
        assert str(path) in str(e.value)


def test_mismatched_index_file_is_refused_naming_the_file(flat_copy):
    meta = IndexMetadata.load(flat_copy)
    meta.faiss_checksum = None
    meta.save(flat_copy)
    other = faiss.IndexFlatL2(meta.dim + 1)
    other.add(np.zeros((meta.passages - 1, meta.dim + 1), dtype=np.float32))
    faiss.write_index(other, str(flat_copy / FAISS_NAME))
    with pytest.raises(IndexMismatchError) as e:
        open_searcher(flat_copy, threads=1)
    text = str(e.value)
    assert str(flat_copy / FAISS_NAME) in text and "does not match its metadata" in text
    for part in (f"holds {meta.passages - 1} vectors", f"{meta.dim + 1}-d", "not inner product"):
        assert part in text
    (flat_copy / FAISS_NAME).unlink()
    with pytest.raises(IndexMismatchError, match="faiss index file not found"):
        open_searcher(flat_copy, threads=1)


def _recall(rows: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(rows.tolist(), truth.tolist())]))


def _save_plain_index(tmp_path, index, n, dim) -> tuple:
    faiss.write_index(index, str(tmp_path / FAISS_NAME))
    meta = IndexMetadata(
        retriever="e5", corpus_path="c", corpus_size=0, corpus_checksum="c", passages=n, dim=dim, faiss_type="test"
    )
    return tmp_path, meta


def test_nprobe_and_ef_search_reach_faiss(tmp_path):
    base, queries = _clustered(4000, 32, seed=2), _clustered(100, 32, seed=3)
    _, truth = _numpy_top_k(queries, base, 3)
    ivf = faiss.index_factory(32, "IVF64,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(base)
    ivf.add(base)
    index_dir, meta = _save_plain_index(tmp_path, ivf, 4000, 32)
    recalls = {}
    for nprobe in (1, 64):
        index, mapped, params = open_faiss_index(index_dir, meta, search_params={"nprobe": nprobe})
        assert mapped and params == {"nprobe": nprobe} and faiss.extract_index_ivf(index).nprobe == nprobe
        recalls[nprobe] = _recall(index.search(queries, 3)[1], truth)
    assert recalls[1] < 0.9 and recalls[64] == 1.0  # all 64 lists: exhaustive
    meta.search_params = {"nprobe": 64}  # the metadata's value is the default, a serve-time value overrides it
    assert faiss.extract_index_ivf(open_faiss_index(index_dir, meta)[0]).nprobe == 64
    assert faiss.extract_index_ivf(open_faiss_index(index_dir, meta, search_params={"nprobe": 2})[0]).nprobe == 2
    with pytest.raises(ValueError, match=r"efSearch=32 does not apply .* \(it takes: nprobe\)"):
        open_faiss_index(index_dir, meta, search_params={"efSearch": 32})

    hnsw = faiss.index_factory(32, "HNSW8", faiss.METRIC_INNER_PRODUCT)
    hnsw.add(base)
    (tmp_path / "hnsw").mkdir()
    hnsw_dir, hnsw_meta = _save_plain_index(tmp_path / "hnsw", hnsw, 4000, 32)
    by_ef = {}
    for ef in (1, 256):
        index, _, _ = open_faiss_index(hnsw_dir, hnsw_meta, search_params={"efSearch": ef})
        assert faiss.downcast_index(index).hnsw.efSearch == ef
        by_ef[ef] = _recall(index.search(queries, 3)[1], truth)
    assert by_ef[1] < 0.5 and by_ef[256] >= 0.99


@pytest.mark.slow
def test_rerank_makes_an_approximate_index_exact_when_the_true_top_k_are_candidates():
    base, queries = _clustered(3000, 32, seed=4), _clustered(150, 32, seed=5)
    k, k_factor = 3, 64
    exp_scores, exp_rows = _numpy_top_k(queries, base, k)
    for refine in ("RFlat", "Refine(Flat)"):
        index = faiss.index_factory(32, f"IVF16,PQ16x4fs,{refine}", faiss.METRIC_INNER_PRODUCT)
        index.train(base)
        index.add(base)
        apply_search_params(index, {"nprobe": 16, "k_factor_rf": k_factor})  # every list: candidates = PQ's best
        approx = faiss.downcast_index(index).base_index
        _, candidates = approx.search(queries, k * k_factor)
        assert all(set(t) <= set(c) for t, c in zip(exp_rows.tolist(), candidates.tolist()))  # the case's premise
        assert _recall(approx.search(queries, k)[1], exp_rows) < 0.5  # 4-bit PQ alone ranks them wrong
        scores, rows = index.search(queries, k)
        np.testing.assert_array_equal(rows, exp_rows)
        np.testing.assert_allclose(scores, exp_scores, rtol=1e-5, atol=1e-5)


def test_tunable_params_lists_faiss_knobs():
    index = faiss.index_factory(16, "IVF8,PQ4x4fs,Refine(SQfp16)", faiss.METRIC_INNER_PRODUCT)
    knobs = tunable_params(index)
    assert knobs["nprobe"][:3] == [1.0, 2.0, 4.0] and knobs["k_factor_rf"][:3] == [1.0, 2.0, 4.0]
    assert tunable_params(faiss.IndexFlatIP(16)) == {}


def test_read_refuses_a_missing_file(tmp_path):
    meta = IndexMetadata(retriever="e5", corpus_path="c", corpus_size=0, corpus_checksum="c", passages=1, dim=4)
    with pytest.raises(IndexMismatchError, match="not found"):
        read_faiss_index(tmp_path / FAISS_NAME, meta)


def test_gpu_ids_are_parsed_once_and_unseen_gpus_refused():
    from rlinf_ext.retrieval.config import parse_gpu_ids

    assert parse_gpu_ids("all", 4) == [0, 1, 2, 3]
    assert parse_gpu_ids("1, 3", 4) == [1, 3]
    for bad in ("5", "0,4", "all"):
        with pytest.raises(ValueError, match="pass 'all' or ids below"):
            parse_gpu_ids(bad, 4 if bad != "all" else 0)
