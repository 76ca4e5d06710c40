"""Loading a file of scripts/ or benchmarks/ as a module in a test: they are not a package, and some import their
siblings by bare name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script(path: Path | str, name: str | None = None) -> ModuleType:
    """Execute ``path`` (absolute, or relative to the repository) as module ``name`` (default: its stem), with its
    folder on ``sys.path`` while it runs, registered in ``sys.modules`` (its dataclasses look their module up).
    Module level only: every script does its work under ``__main__``."""
    path = Path(path) if Path(path).is_absolute() else REPO / path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module
