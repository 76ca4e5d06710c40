"""Documentation names files that exist: every repository path written in a module docstring, a comment, the
README or docs/*.md resolves (against the repository root, ``rlinf_ext/`` or ``tests/``)."""

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
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "examples" / "searchr1" / "README.md"]:
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
