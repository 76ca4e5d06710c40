"""Plug-ins named by where they live: ``"pkg.module:attr"`` import paths (agents, their components, tools), so that
what a researcher adds can sit outside ``rlinf_ext`` and be chosen from a YAML."""

from __future__ import annotations

import functools
import importlib
from typing import Any


def is_import_path(name: str) -> bool:
    return ":" in name


def load_path(path: str, what: str) -> Any:
    """``"pkg.module:attr"`` (or ``attr.member``, e.g. a classmethod) -> the object; an error that names ``what``
    and the path when it cannot be found."""
    module, _, attr = path.partition(":")
    try:
        return functools.reduce(getattr, attr.split("."), importlib.import_module(module))
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"{what}: cannot import module {module!r} of {path!r} ({exc}); is its package on PYTHONPATH?"
        ) from exc
    except AttributeError:
        raise ValueError(f"{what}: module {module!r} has no attribute {attr!r} ({path!r})") from None
