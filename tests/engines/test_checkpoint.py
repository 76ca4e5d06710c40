import pytest

from rlinf_ext.engines.checkpoint import (
    check_complete,
    finalize,
    latest_complete_checkpoint,
    staging_dir,
    step_of,
)


def _write(root, step, payload=b"x" * 100):
    tmp = staging_dir(root, step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "model.pt").write_bytes(payload)
    (tmp / "data").mkdir()
    (tmp / "data" / "data.pt").write_bytes(b"d")
    return finalize(tmp, step)


def test_latest_complete_and_truncation_skipped(tmp_path):
    _write(tmp_path, 1)
    _write(tmp_path, 2)
    newest = _write(tmp_path, 3)
    assert latest_complete_checkpoint(tmp_path).name == "global_step_3"
    # truncate a file of the newest one: it must be skipped with a warning
    (newest / "actor" / "model.pt").write_bytes(b"x" * 10)
    assert "truncated" in check_complete(newest)
    with pytest.warns(RuntimeWarning, match="global_step_3"):
        assert latest_complete_checkpoint(tmp_path).name == "global_step_2"
    # a half-written staging dir is never picked, a dir without marker is skipped
    staging_dir(tmp_path, 4)
    (tmp_path / "global_step_5").mkdir()
    with pytest.warns(RuntimeWarning) as record:
        assert latest_complete_checkpoint(tmp_path).name == "global_step_2"
    assert any("marker" in str(w.message) for w in record) and any("truncated" in str(w.message) for w in record)
    assert step_of(tmp_path / "global_step_2") == 2


def test_refinalize_replaces_and_empty_root(tmp_path):
    assert latest_complete_checkpoint(tmp_path / "none") is None
    _write(tmp_path, 1, b"a")
    final = _write(tmp_path, 1, b"bb")
    assert (final / "actor" / "model.pt").read_bytes() == b"bb"
    assert check_complete(final) is None
