"""Ready-made web tools: ``read_page`` (a page's main text) and ``web_search`` (pluggable providers).

Needs the ``web`` extra: ``pip install 'criogenai[web]'``. Pass the tools in ``tools=`` and define
them at the top level of a module your workers serve. What they may reach is a ``WebPolicy`` the
application sets; see the README's "Web tools" section for the SSRF rules.
"""

try:
    import protego as _protego  # noqa: F401
    import trafilatura as _trafilatura  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(f"criogenai.web needs the web extra: pip install 'criogenai[web]' ({exc})") from exc

from ._policy import DEFAULT_USER_AGENT, METADATA_ADDRESSES, WebPolicy
from ._search import BraveSearch, SearchProvider, SearchResult, SearxNG
from ._tools import page_reader, read_page, web_search

__all__ = [
    "DEFAULT_USER_AGENT",
    "METADATA_ADDRESSES",
    "BraveSearch",
    "SearchProvider",
    "SearchResult",
    "SearxNG",
    "WebPolicy",
    "page_reader",
    "read_page",
    "web_search",
]
