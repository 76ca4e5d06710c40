"""Import every ``rlinf_ext`` module first, alone: the script ``tests/test_import_first.py`` runs in a fresh
interpreter. It imports the third-party modules and names the modules import at their top (so that each child does
not pay for torch again, nor for a lazily exported name such as transformers' model classes or Megatron's
optimizer, seconds per child), checks that no ``rlinf_ext`` module is loaded yet, then forks one child per module,
which imports that module and nothing else of ``rlinf_ext`` before it. Prints one JSON line: {module: error} for the failures."""

from __future__ import annotations

import ast
import compileall
import contextlib
import importlib
import json
import multiprocessing
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.test_layout import PACKAGE_ROOT, read_imports  # noqa: E402


def import_alone(module: str) -> tuple[str, str | None]:
    try:
        importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - every failure is the finding
        return module, traceback.format_exc(limit=-3)
    return module, None


def third_party_names(root: Path) -> set[tuple[str, str | None]]:
    """(module, name) of each import outside functions in the package's files that is not of ``rlinf_ext`` nor
    of the standard library: ``import a.b`` -> ("a.b", None), ``from a.b import c`` -> ("a.b", "c")."""
    found: set[tuple[str, str | None]] = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        local = {
            id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if id(node) in local:
                continue
            if isinstance(node, ast.Import):
                found |= {(a.name, None) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found |= {(node.module, a.name) for a in node.names if a.name != "*"}
    top = {m.split(".")[0] for m, _ in found}
    keep = top - set(sys.stdlib_module_names) - {"rlinf_ext", "__future__"}
    return {(m, n) for m, n in found if m.split(".")[0] in keep}


def preload(module: str, name: str | None) -> None:
    # any failure (an optional package absent here) is left to the child of the module that needs it to report
    with contextlib.suppress(Exception):
        mod = importlib.import_module(module)
        if name is not None and not hasattr(mod, name):  # a submodule, not yet imported by its package
            importlib.import_module(f"{module}.{name}")


def main() -> None:
    modules, _ = read_imports(PACKAGE_ROOT)
    # every child imports a closure of the package: compiled once here (written even under PYTHONDONTWRITEBYTECODE,
    # which would have each of the ~250 children compile its closure again; ~4 CPU-s)
    compileall.compile_dir(str(PACKAGE_ROOT), quiet=1)
    for module, name in sorted(third_party_names(PACKAGE_ROOT), key=lambda mn: (mn[0], mn[1] or "")):
        preload(module, name)
    loaded = [m for m in sys.modules if m == "rlinf_ext" or m.startswith("rlinf_ext.")]
    assert not loaded, f"rlinf_ext modules loaded before the test: {loaded}"
    with multiprocessing.get_context("fork").Pool(
        int(sys.argv[1]) if len(sys.argv) > 1 else 2, maxtasksperchild=1
    ) as pool:
        results = pool.map(import_alone, sorted(modules), chunksize=1)
    print(json.dumps({"modules": len(results), "failures": {m: e for m, e in results if e}}), flush=True)
    os._exit(0)  # the report is out: no teardown of the preloaded torch/vLLM/Megatron stack (~2 CPU-s)


if __name__ == "__main__":
    main()
