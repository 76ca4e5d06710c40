"""Import every ``rlinf_ext`` module first, alone: the script ``tests/test_import_first.py`` runs in a fresh
interpreter. It imports the third-party packages the modules import at their top (so that each child does not pay
for torch again), checks that no ``rlinf_ext`` module is loaded yet, then forks one child per module, which imports
that module and nothing else of ``rlinf_ext`` before it. Prints one JSON line: {module: error} for the failures."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_layout import PACKAGE_ROOT, read_imports  # noqa: E402


def import_alone(module: str) -> tuple[str, str | None]:
    try:
        importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - every failure is the finding
        return module, traceback.format_exc(limit=-3)
    return module, None


def main() -> None:
    modules, imports = read_imports(PACKAGE_ROOT)
    third_party = sorted({i.target for i in imports if not i.lazy and not i.target.startswith("rlinf_ext")
                          and i.target not in sys.stdlib_module_names and i.target != "__future__"})
    for name in third_party:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional package absent here: the module that needs it reports it
            pass
    loaded = [m for m in sys.modules if m == "rlinf_ext" or m.startswith("rlinf_ext.")]
    assert not loaded, f"rlinf_ext modules loaded before the test: {loaded}"
    with multiprocessing.get_context("fork").Pool(int(sys.argv[1]) if len(sys.argv) > 1 else 2,
                                                  maxtasksperchild=1) as pool:
        results = pool.map(import_alone, sorted(modules), chunksize=1)
    print(json.dumps({"modules": len(results), "failures": {m: e for m, e in results if e}}))


if __name__ == "__main__":
    main()
