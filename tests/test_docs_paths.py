"""Documentation names files that exist: every repository path written in a module docstring, a comment, the
README or docs/*.md resolves (against the repository root, ``rlinf_ext/`` or ``tests/``); README and docs/*.md
name no missing module or folder even without an extension; nothing in the repository points to notes outside it;
docs/status.md has three columns (capability, one of its status values, the tests that prove it); the README stays a front page (<= 10 KiB); `.ci/run` runs the
README's test command verbatim."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# a relative path ending in a source or doc file, e.g. runner/launch.py, docs/contracts.md, configs/x/y.yaml
PATH = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)+[\w.-]+\.(?:py|md|yaml|sh|jinja))\b")
ROOTS = (REPO, REPO / "rlinf_ext", REPO / "tests")
# paths that name files in other repositories or on the user's machine, not in this one
FOREIGN = re.compile(r"^(rlinf|sglang|megatron|ray|torch|transformers|faiss|vllm|search_r1)/")
# run outputs and placeholders written as examples
GENERATED = re.compile(r"^(outputs|runs|DIR|RUN_DIR|OUT)/|^configs/group/name\.yaml$")


def _doc_texts():
    for path in sorted((REPO / "rlinf_ext").rglob("*.py")):
        text = path.read_text()
        # docstrings and comments only (string literals in code may be user-facing examples)
        parts = re.findall(r'"""(.*?)"""', text, re.S) + re.findall(r"#[^\n]*", text)
        yield path, "\n".join(parts)
    for path in [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        REPO / "examples" / "searchr1" / "README.md",
    ]:
        if path.is_file():
            yield path, path.read_text()


def _exists(rel: str) -> bool:
    rel = rel.removeprefix("REPO/")  # the recipe writes REPO/ for the repository root
    return bool(GENERATED.search(rel)) or any((root / rel).exists() for root in ROOTS)


def test_every_documented_path_exists():
    missing = []
    for path, text in _doc_texts():
        if path.name == "searchr1-facts.md":  # describes the peer repositories' files, not ours
            continue
        for rel in set(PATH.findall(text)):
            if FOREIGN.search(rel) or _exists(rel):
                continue
            missing.append(f"{path.relative_to(REPO)}: {rel}")
    assert not missing, "paths named in documentation that do not exist:\n" + "\n".join(sorted(missing))


# --- extension-less references: `rlinf_ext/agent/mm_loop`, `scripts/install`, a folder that is not there ---------
# a path anchored at a top-level folder of this repository, with or without an extension; it stops at characters
# that start placeholders or globs (`<bench>`, `*.yaml`, `{a,b}`), so what is left must exist as written
ROOTED = re.compile(r"(?<![\w./-])((?:rlinf_ext|scripts|docs|examples|configs|tests|benchmarks|toolkits)/[\w./-]*)")


def _markdown_docs():
    yield REPO / "README.md"
    yield from sorted((REPO / "docs").glob("*.md"))
    yield from sorted((REPO / "examples").glob("*/README.md"))


def rooted_paths_missing(text: str) -> list[str]:
    """Repository-rooted paths in ``text`` that do not exist (file or folder), extension or not."""
    missing = []
    for rel in set(ROOTED.findall(text)):
        rel = rel.rstrip(".")  # end of a sentence
        if not GENERATED.search(rel) and not (REPO / rel).exists():
            missing.append(rel)
    return sorted(missing)


def test_rooted_paths_in_markdown_exist_even_without_an_extension():
    missing = []
    for path in _markdown_docs():
        if path.name == "searchr1-facts.md":  # describes the peer repositories' files, not ours
            continue
        missing += [f"{path.relative_to(REPO)}: {rel}" for rel in rooted_paths_missing(path.read_text())]
    assert not missing, "paths named in README/docs that do not exist (a module without .py, a moved folder?):\n" + (
        "\n".join(missing)
    )


def test_the_rooted_path_check_can_fail():
    text = (
        "see `rlinf_ext/agent/no_such_module`, `scripts/install` and rlinf_ext/no_such_package/; "
        "`rlinf_ext/runner/launch.py`, `rlinf_ext/agent/` and `examples/searchr1/config/*.yaml` exist."
    )
    assert rooted_paths_missing(text) == [
        "rlinf_ext/agent/no_such_module",
        "rlinf_ext/no_such_package/",
        "scripts/install",
    ]


# --- nothing points outside the repository: notes, reviews and design documents the reader does not have -------
OUTSIDE = re.compile(
    r"mmsearch-r1-design|gpu-path-review|rlinf-protocol|engine-stack|retrieval-scale|architecture\.md"
    r"|\.\./shared|(?<![\w-])reference/|\breview (?:R\d|§|D\d)|\bGPU review\b|design notes"
    r"|(?<!docs/)searchr1-facts"  # docs/searchr1-facts.md is in this repository; any other spelling is not
)
SCANNED = ("README.md", "docs", "rlinf_ext", "scripts", "benchmarks", "tests", "examples", "configs", "toolkits", ".ci")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".txt", ".sbatch", ".jinja", ".ini", ".toml", ""}


def outside_references(text: str) -> list[str]:
    return sorted({m.group(0) for m in OUTSIDE.finditer(text)})


def test_no_reference_to_material_outside_the_repository():
    found = []
    for top in SCANNED:
        root = REPO / top
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if path == Path(__file__).resolve() or path.suffix not in TEXT_SUFFIXES or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            found += [f"{path.relative_to(REPO)}: {hit}" for hit in outside_references(text)]
    assert not found, "references to documents outside the repository (state the fact instead):\n" + "\n".join(found)


def test_the_outside_reference_check_can_fail():
    assert outside_references("see gpu-path-review §4 and review R1; docs/searchr1-facts.md §2 is ours") == [
        "gpu-path-review",
        "review R1",
    ]
    assert outside_references("(searchr1-facts §3, ../shared/x)") == ["../shared", "searchr1-facts"]


# --- docs/status.md: capability | status | test -----------------------------------------------------------------
STATUS_VALUES = {"working", "GPU-verified (one H100)", "written, not GPU-verified", "—"}
STATUS_HEADER = "| capability | status | test |"
NO_TEST = "—"  # a row nothing here can test (e.g. the Slurm script): said, not hidden


def status_row_problems(line: str) -> list[str]:
    """What is wrong with one row of docs/status.md: three cells, a known status, short cells, and a test cell that
    names existing files (`path` or `path::test_name`, the test defined there), or says there is none."""
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 3:
        return [f"{len(cells)} cells, not 3 (capability | status | test)"]
    capability, status, tests = cells
    problems = [] if status in STATUS_VALUES else [f"status {status!r} is not one of {sorted(STATUS_VALUES)}"]
    problems += [f"a cell over 150 characters: {c[:40]}..." for c in cells if len(c) > 150]
    refs = re.findall(r"`([^`]+)`", tests)
    if tests != NO_TEST and not refs:
        problems.append(f"the test cell names no test file: {tests!r}")
    for ref in refs:
        path, _, name = ref.partition("::")
        file = REPO / path
        if not file.exists():
            problems.append(f"{path} does not exist")
        elif name and not re.search(rf"^\s*(async )?def {re.escape(name.split('[')[0])}\(", file.read_text(), re.M):
            problems.append(f"{path} defines no {name}")
    return problems


def test_status_rows_name_a_status_and_their_tests():
    bad, rows = [], 0
    for line in (REPO / "docs" / "status.md").read_text().splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        if line.startswith("| capability |"):
            assert line.strip() == STATUS_HEADER, f"status table header: {line!r}, expected {STATUS_HEADER!r}"
            continue
        rows += 1
        bad += [f"{line[:60]}...: {p}" for p in status_row_problems(line)]
    assert rows > 0 and not bad, "docs/status.md rows:\n" + "\n".join(bad)


def test_the_status_row_check_can_fail():
    assert status_row_problems("| a | working | `tests/test_layout.py::test_no_import_cycles` |") == []
    assert status_row_problems("| a | working | `tests/test_layout.py` (2 of 3 pass) |") == []
    assert status_row_problems("| a | written, not GPU-verified | — |") == []
    assert status_row_problems("| a | works | `tests/no_such_test.py`, `tests/test_layout.py::test_gone` |") == [
        "status 'works' is not one of ['GPU-verified (one H100)', 'working', 'written, not GPU-verified', '—']",
        "tests/no_such_test.py does not exist",
        "tests/test_layout.py defines no test_gone",
    ]
    assert status_row_problems("| a | working | 717 tests in 154 s |") == [
        "the test cell names no test file: '717 tests in 154 s'"
    ]
    assert status_row_problems("| a | working |") == ["2 cells, not 3 (capability | status | test)"]


def test_readme_is_a_front_page():
    assert len((REPO / "README.md").read_bytes()) <= 10 * 1024


DOCS_BUDGET_BYTES = 170_000  # docs/*.md and every README: read in one sitting (figures live in results.md only)


def test_the_docs_fit_in_one_sitting():
    import subprocess

    tracked = subprocess.run(
        ["git", "ls-files", "docs/*.md", "*README*.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    sizes = {path: len((REPO / path).read_bytes()) for path in tracked if (REPO / path).is_file()}
    assert "docs/results.md" in sizes and "README.md" in sizes
    assert sum(sizes.values()) <= DOCS_BUDGET_BYTES, sorted(sizes.items(), key=lambda kv: -kv[1])


def test_ci_runs_the_readmes_test_command_verbatim():
    """The README's "Install and run the tests" command is the line `.ci/run` executes, character for character."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"\*\*Install and run the tests:\*\*\n```bash\n(.+?)\n```", readme)
    assert block, "README: the 'Install and run the tests' bash block is missing"
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert block.group(1) in ci_lines, f".ci/run does not run the README's test command: {block.group(1)!r}"


# --- test counts come from pytest's collection (scripts/test_counts.py), never typed into the front documents --
TYPED_COUNT = re.compile(r"\b\d+ (?:of \d+ )?tests?\b")


def test_no_hand_typed_test_counts():
    found = [
        f"{name}: {m.group(0)}"
        for name in ("README.md", "docs/status.md")
        for m in TYPED_COUNT.finditer((REPO / name).read_text())
    ]
    assert not found, "test counts typed by hand (name scripts/test_counts.py instead):\n" + "\n".join(found)


def test_the_typed_count_check_can_fail():
    assert [m.group(0) for m in TYPED_COUNT.finditer("904 tests in 872 s; 785 of 904 tests stay; 2 workers")] == [
        "904 tests",
        "785 of 904 tests",
    ]
