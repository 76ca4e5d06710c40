"""benchmarks/weight_sync_bench.py's side-by-side table (pure): one row per shape and path, one column per engine,
the second engine over the first, and a dash where an engine has no such row."""

from __future__ import annotations

from tests.support.script_modules import load_script


def load_bench():
    return load_script("benchmarks/weight_sync_bench.py")  # it imports train_step_bench from its own folder


def test_side_by_side_rows_columns_and_ratio():
    bench = load_bench()
    rows = [
        dict(engine="hf", shape="tiny", path="broadcast", s=0.2, first=1.0),
        dict(engine="hf", shape="tiny", path="paired", s=0.1, first=1.0),
        dict(engine="vllm", shape="tiny", path="paired", s=0.25, first=2.0),
    ]
    lines = bench.side_by_side(rows).splitlines()
    assert lines[0].split() == ["shape", "path", "hf", "s/sync", "vllm", "s/sync", "vllm/hf"]
    assert lines[1].split() == ["tiny", "broadcast", "0.200", "-"]
    assert lines[2].split() == ["tiny", "paired", "0.100", "0.250", "2.50x"]
    assert bench.PATHS["vllm"] == bench.PATHS["hf"] == ("paired", "broadcast")
