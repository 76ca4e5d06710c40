"""Search tool: async client for the retrieval server (rate limit, in-flight cap, retries) and formatting."""

from rlinf_ext.tools.config import SearchToolConfig
from rlinf_ext.tools.documents import Document
from rlinf_ext.tools.formatting import build_invalid_action_observation, build_observation, format_documents
from rlinf_ext.tools.http_session import close_http_session
from rlinf_ext.tools.search import SearchError, SearchResult, SearchTool

__all__ = [
    "Document",
    "SearchError",
    "SearchResult",
    "SearchTool",
    "SearchToolConfig",
    "build_invalid_action_observation",
    "build_observation",
    "close_http_session",
    "format_documents",
]
