"""The order test files run in (tests/conftest.py, FILE_SECONDS): longest first by the durations table, files it
lacks last in collection order; `--write-file-durations PATH` merges a run's seconds per file into the table."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FILE_SECONDS, MIN_LISTED_S

REPO = Path(__file__).resolve().parents[1]
UNLISTED = "tests/test_layout.py::test_engines_room_is_gone"
SHORT = "tests/runner/test_launch_config.py::test_cli_rejects_a_bare_word_override"  # a quick test, its block long
LONG = "tests/e2e/test_reference_recipe.py::test_a_changed_readme_step_is_caught"  # a quick test in a long file


def test_the_table_lists_existing_files_longest_first():
    table = json.loads(FILE_SECONDS.read_text())
    assert table, FILE_SECONDS
    missing = [path for path in table if not (REPO / path).is_file()]
    assert not missing, f"{FILE_SECONDS.name} names files that are gone: {missing}; refresh it (--write-file-durations)"
    assert list(table.values()) == sorted(table.values(), reverse=True)
    assert min(table.values()) >= MIN_LISTED_S


@pytest.mark.slow
def test_longest_files_run_first_and_a_run_rewrites_what_it_timed(tmp_path):
    table = json.loads(FILE_SECONDS.read_text())
    runner_total = sum(s for path, s in table.items() if path.startswith("tests/runner/"))
    # the runner directory's block (its files' total) before the recipe's file, though each file is shorter
    assert runner_total > table["tests/e2e/test_reference_recipe.py"] > table["tests/runner/test_launch_config.py"]
    assert table["tests/runner/test_launch_config.py"] >= MIN_LISTED_S and "tests/test_layout.py" not in table
    out = tmp_path / "durations.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            UNLISTED,
            SHORT,
            LONG,
            "--write-file-durations",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ran = re.findall(r"^(tests/\S+::\S+) PASSED", run.stdout, re.M)
    assert ran == [SHORT, LONG, UNLISTED], run.stdout[-3000:]
    # the three files took under a second each this time: dropped, every other entry kept as it was
    written = json.loads(out.read_text())
    gone = {"tests/e2e/test_reference_recipe.py", "tests/runner/test_launch_config.py"}
    assert written == {path: s for path, s in table.items() if path not in gone}
    assert json.loads(FILE_SECONDS.read_text()) == table  # the repo's table untouched


def test_the_order_key_by_hand():
    from tests.conftest import file_order_key

    seconds = {
        "tests/e2e/a.py": 52.0,
        "tests/runner/r1.py": 50.0,
        "tests/runner/r2.py": 5.0,
        "tests/x/b.py": 20.0,
        "tests/x/d.py": 20.0,
    }
    collected = [
        "tests/runner/r0.py",
        "tests/runner/r2.py",
        "tests/x/c.py",
        "tests/x/d.py",
        "tests/runner/r1.py",
        "tests/x/b.py",
        "tests/e2e/a.py",
    ]
    # the runner block first, at its files' total of 55 s (r1, r2, then unlisted r0), before a's 52 s; d before b
    # (equal seconds: collection order); c unlisted, last
    assert sorted(collected, key=file_order_key(seconds)) == [
        "tests/runner/r1.py",
        "tests/runner/r2.py",
        "tests/runner/r0.py",
        "tests/e2e/a.py",
        "tests/x/d.py",
        "tests/x/b.py",
        "tests/x/c.py",
    ]


def test_a_shared_process_directory_is_one_unit_of_work():
    from tests.conftest import VLLM_IN_PROCESS_FILES, VLLM_IN_PROCESS_UNIT, xdist_scope

    assert (
        xdist_scope("tests/runner/test_trainer_cpu.py::test_x")
        == xdist_scope("tests/runner/r0.py::t")
        == ("tests/runner/")
    )
    assert xdist_scope("tests/e2e/test_multinode.py::test_x") == "tests/e2e/test_multinode.py"
    assert xdist_scope(f"{VLLM_IN_PROCESS_FILES[0]}::test_x") == VLLM_IN_PROCESS_UNIT
