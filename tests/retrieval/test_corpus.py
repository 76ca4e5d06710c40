import gzip
import json

import numpy as np
import pytest

from rlinf_ext.retrieval import corpus as corpus_module
from rlinf_ext.retrieval.corpus import (
    CorpusError,
    CorpusStore,
    PagesStore,
    file_fingerprint,
    normalize_doc,
    normalize_url,
    scan_line_ranges,
    split_contents,
)


def test_split_contents_hand_cases():
    assert split_contents('"Paris"\nCapital of France.') == ("Paris", "Capital of France.")
    assert split_contents('"A "quoted" name"\nx\ny') == ('A "quoted" name', "x\ny")
    assert split_contents("no title line") == ("", "no title line")
    assert split_contents("Bare title\ntext") == ("Bare title", "text")


def test_normalize_doc_adds_title_text_and_keeps_url():
    doc = normalize_doc({"id": 7, "contents": '"T"\nbody', "url": "u"}, row_index=0)
    assert doc == {"id": "7", "contents": '"T"\nbody', "url": "u", "title": "T", "text": "body"}
    # A row without id gets its row number; one without contents gets it rebuilt from title/text.
    doc = normalize_doc({"title": "T", "text": "body"}, row_index=5)
    assert doc["id"] == "5" and doc["contents"] == '"T"\nbody'


def test_scan_line_ranges_skips_blank_lines_and_handles_missing_final_newline(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"a":1}\n\n{"b":22}\r\n{"c":3}')
    ranges = scan_line_ranges(path)
    data = path.read_bytes()
    assert [data[s : s + n] for s, n in ranges] == [b'{"a":1}', b'{"b":22}\r', b'{"c":3}']


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_corpus_store_reads_rows_by_number_and_caches_offsets(tmp_path):
    rows = [{"id": str(i), "contents": f'"T{i}"\ntext {i}'} for i in range(50)]
    corpus = tmp_path / "wiki.jsonl"
    _write_rows(corpus, rows)
    cache = tmp_path / "idx"
    store = CorpusStore.open(corpus, cache_dir=cache)
    assert len(store) == 50
    assert store.get(17)["contents"] == rows[17]["contents"] and store.get(17)["title"] == "T17"
    assert [d["id"] for d in store.get_many(np.array([3, 1, 49]))] == ["3", "1", "49"]
    assert (cache / "wiki.jsonl.offsets.npy").exists()
    with pytest.raises(IndexError):
        store.get(50)
    # Second open memory-maps the cache instead of rescanning.
    again = CorpusStore.open(corpus, cache_dir=cache)
    assert isinstance(again._file.ranges, np.memmap)
    # A changed corpus invalidates the cache (fingerprint differs) and is rescanned.
    _write_rows(corpus, rows[:10])
    assert len(CorpusStore.open(corpus, cache_dir=cache)) == 10


def test_corpus_store_errors_name_the_problem(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        CorpusStore.open(tmp_path / "missing.jsonl")
    gz = tmp_path / "wiki-18.jsonl.gz"
    gz.write_bytes(b"x")
    with pytest.raises(CorpusError, match="is truncated or not gzip .*rerun examples/searchr1/download.py"):
        CorpusStore.open(gz)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "x"}\nnot json\n')
    store = CorpusStore.open(bad)
    with pytest.raises(CorpusError, match="row 1 is not valid JSON"):
        store.get(1)


def test_fingerprint_sees_head_tail_and_size_changes(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"a" * 3_000_000)
    base = file_fingerprint(path)
    path.write_bytes(b"a" * 2_999_999 + b"b")
    assert file_fingerprint(path) != base
    path.write_bytes(b"a" * 3_000_001)
    assert file_fingerprint(path) != base


def test_pages_store_lookup_rewrites_index_php_and_returns_none_for_unknown(tmp_path):
    pages = tmp_path / "pages.jsonl"
    rows = [
        {"url": f"https://en.wikipedia.org/wiki/P{i}", "title": f"P{i}", "contents": f"page {i}"} for i in range(100)
    ]
    rows.append({"url": "https://x.org/w/index.php?title=Foo", "title": "Foo", "contents": "foo"})
    _write_rows(pages, rows)
    store = PagesStore.open(pages, cache_dir=tmp_path / "idx")
    assert len(store) == 101
    for i in (0, 42, 99):
        assert store.lookup(f"https://en.wikipedia.org/wiki/P{i}") == rows[i]
    assert store.lookup("https://x.org/w/index.php/Foo") == rows[100]
    assert normalize_url("https://x.org/w/index.php/Foo") == "https://x.org/w/index.php?title=Foo"
    assert store.lookup("https://en.wikipedia.org/wiki/Nope") is None


def test_pages_store_requires_url_field(tmp_path):
    pages = tmp_path / "pages.jsonl"
    _write_rows(pages, [{"title": "no url"}])
    with pytest.raises(CorpusError, match="no string 'url'"):
        PagesStore.open(pages)


def _wiki18_gz(path, n: int = 300) -> bytes:
    """A wiki-18.jsonl.gz of ``n`` rows; returns the plain bytes."""
    plain = "".join(
        json.dumps({"id": str(i), "contents": f'"T{i}"\ntext {i} ' + "w " * (i % 7)}) + "\n" for i in range(n)
    ).encode()
    path.write_bytes(gzip.compress(plain))
    return plain


def test_a_gzip_corpus_is_unpacked_once_beside_it_and_reused(tmp_path):
    gz = tmp_path / "wiki-18.jsonl.gz"
    plain = _wiki18_gz(gz)
    store = CorpusStore.open(gz)
    assert store.path == tmp_path / "wiki-18.jsonl" and store.path.read_bytes() == plain
    assert len(store) == 300 and store.get(299)["title"] == "T299"
    stamp = store.path.stat().st_mtime_ns
    assert CorpusStore.open(gz).path.stat().st_mtime_ns == stamp  # finished: reused, not unpacked again
    plain = _wiki18_gz(gz, n=200)  # another file under the same name: unpacked again
    assert CorpusStore.open(gz).path.read_bytes() == plain


def test_an_interrupted_unpack_resumes_keeping_what_was_written(tmp_path, monkeypatch):
    gz = tmp_path / "wiki-18.jsonl.gz"
    plain = _wiki18_gz(gz, n=2000)
    monkeypatch.setattr(corpus_module, "_UNPACK_BLOCK", 1000)
    real_write_state, calls = corpus_module._write_state, []

    def killed_at_the_third_block(path, state):
        calls.append(state)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the third block is on disk, its record is not
        real_write_state(path, state)

    monkeypatch.setattr(corpus_module, "_write_state", killed_at_the_third_block)
    with pytest.raises(KeyboardInterrupt):
        corpus_module.unpack_gzip(gz)
    partial = tmp_path / "wiki-18.jsonl.partial"
    assert partial.stat().st_size == 3000
    with open(partial, "r+b") as f:  # a mark a restart from zero would overwrite and a resume keeps
        f.write(b"#")
    monkeypatch.setattr(corpus_module, "_write_state", real_write_state)
    out = corpus_module.unpack_gzip(gz)
    data = out.read_bytes()
    assert data[:1] == b"#" and data[1:] == plain[1:] and not partial.exists()


def test_a_truncated_gzip_is_refused_naming_the_fix(tmp_path):
    gz = tmp_path / "wiki-18.jsonl.gz"
    _wiki18_gz(gz)
    gz.write_bytes(gz.read_bytes()[:-50])
    with pytest.raises(CorpusError, match=r"wiki-18.jsonl.gz is truncated or not gzip \(EOFError"):
        CorpusStore.open(gz)
    assert not (tmp_path / "wiki-18.jsonl").exists()
