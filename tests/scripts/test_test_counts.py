"""scripts/test_counts.py: the counts come from pytest's collection (its ``--collect-only -q`` lines), per tier and
per folder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("test_counts", REPO / "scripts" / "test_counts.py")
counts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(counts)

# pytest 8's `--collect-only -q` output, as printed (the durations table of pytest.ini's addopts included)
OUTPUT = """tests/config/test_rules.py::test_good_configs_have_no_issue
tests/config/test_rules.py::test_offload[a-b]
tests/test_layout.py::test_no_import_cycles
tests/eval/core/test_eval_loop.py::test_bars_in_order_errors_retried_and_resume

============================= slowest 30 durations =============================
0.01s setup    tests/config/test_rules.py::test_good_configs_have_no_issue
3 tests collected in 0.50s
"""


def test_ids_and_folders_of_a_collection():
    ids = counts.collected_ids(OUTPUT)
    assert ids == [
        "tests/config/test_rules.py::test_good_configs_have_no_issue",
        "tests/config/test_rules.py::test_offload[a-b]",
        "tests/test_layout.py::test_no_import_cycles",
        "tests/eval/core/test_eval_loop.py::test_bars_in_order_errors_retried_and_resume",
    ]
    assert [counts.folder_of(i) for i in ids] == ["tests/config", "tests/config", "tests", "tests/eval/core"]


@pytest.mark.slow  # ~4 s: a pytest process collects this file
def test_a_real_collection_of_this_file():
    ids = counts.collect(None, [str(Path(__file__).relative_to(REPO))])
    assert ids == [
        "tests/scripts/test_test_counts.py::test_ids_and_folders_of_a_collection",
        "tests/scripts/test_test_counts.py::test_a_real_collection_of_this_file",
    ]
    assert counts.collect("slow", [str(Path(__file__).relative_to(REPO))]) == ids[1:]
