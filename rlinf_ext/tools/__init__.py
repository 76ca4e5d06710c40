"""Tools an agent calls: the ``Tool`` base (``base.py``), the registry that builds them by name or import path
(``registry.py``), and the built-in ones (text search: ``search.py``, a client of the retrieval server with rate
limit, in-flight cap and retries; image search: ``image_search.py``).

The names below are imported on first use (PEP 562), so that ``rlinf_ext.tools.base`` stays cheap to import for the
config checks and the agents' turn protocols.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Document": "rlinf_ext.tools.documents",
    "SearchError": "rlinf_ext.tools.search",
    "SearchResult": "rlinf_ext.tools.search",
    "SearchTool": "rlinf_ext.tools.search",
    "TextSearch": "rlinf_ext.tools.search",
    "SearchToolConfig": "rlinf_ext.tools.config",
    "Tool": "rlinf_ext.tools.base",
    "ToolContext": "rlinf_ext.tools.base",
    "ToolOutput": "rlinf_ext.tools.base",
    "build_tools": "rlinf_ext.tools.registry",
    "build_invalid_action_observation": "rlinf_ext.tools.formatting",
    "build_observation": "rlinf_ext.tools.formatting",
    "close_http_session": "rlinf_ext.tools.http_session",
    "format_documents": "rlinf_ext.tools.formatting",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlinf_ext.tools' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
