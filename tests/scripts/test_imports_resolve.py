"""Every module under scripts/ and benchmarks/ imports, and every name it imports from rlinf_ext or from a sibling
module exists, function-local imports included: a moved function fails here, not on a lent GPU after its install
(a GPU smoke stage's local `from rlinf_ext.sync.engine_calls import release_cuda_cache` did once)."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from tests.support.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("scripts", "benchmarks")
MODULES = [p for folder in FOLDERS for p in sorted((REPO / folder).glob("*.py"))]


def imported_names(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of each `from module import name` and (line, module, None) of each `import module`
    anywhere in the file, for modules of rlinf_ext or of the file's own folder."""
    siblings = {p.stem for p in path.parent.glob("*.py")}

    def ours(module: str) -> bool:
        return module.split(".")[0] == "rlinf_ext" or module in siblings

    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and ours(node.module):
            out += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, None) for alias in node.names if ours(alias.name)]
    return out


def unresolved(path: Path) -> list[str]:
    missing = []
    sys.path.insert(0, str(path.parent))  # siblings import each other by bare name
    try:
        for line, module, name in imported_names(path):
            try:
                found = importlib.import_module(module)
            except ImportError as e:
                missing.append(f"{path.name}:{line}: import {module}: {e}")
                continue
            if name is None or name == "*" or hasattr(found, name):
                continue
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{path.name}:{line}: {module} has no {name}")
    finally:
        sys.path.remove(str(path.parent))
    return missing


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_module_imports_and_its_names_resolve(path):
    assert not unresolved(path)
    load_script(path, f"_imported_{path.parent.name}_{path.stem}")


def test_a_moved_name_is_caught(tmp_path):
    script = tmp_path / "stage.py"
    script.write_text("def run():\n    from rlinf_ext.sync.weight_sync import no_such_function\n")
    assert unresolved(script) == ["stage.py:2: rlinf_ext.sync.weight_sync has no no_such_function"]
