"""The ready-made tools: ``read_page`` and ``web_search``, each made for a policy or a provider."""

from __future__ import annotations

from typing import Any

from .._keys import DEFAULT_QUEUE
from ..tools import Tool, tool_from_schema
from ._extract import Format, page
from ._fetch import fetch
from ._policy import WebPolicy
from ._search import SearchProvider

READ_PAGE_DESCRIPTION = (
    "Read a web page given its http or https URL. Returns the page's main text (navigation, ads and "
    "footers removed) as Markdown, or as plain text with format='text', with its title and the final "
    "URL after redirects. Also reads plain text, JSON and PDF."
)

WEB_SEARCH_DESCRIPTION = (
    "Search the web. Returns up to `count` results, each with a title, a URL and a snippet; "
    "read a result's page with the page-reading tool."
)


def page_reader(
    policy: WebPolicy | None = None,
    *,
    name: str = "read_page",
    description: str = READ_PAGE_DESCRIPTION,
    queue: str = DEFAULT_QUEUE,
    max_concurrency: int | None = None,
) -> Tool[..., Any]:
    """A read-only page-reading tool that fetches only what ``policy`` allows (default: public
    addresses, robots.txt respected). Define it at the top level of a module your workers serve."""
    policy = policy or WebPolicy()

    def read_page(url: str, format: Format = "markdown") -> dict[str, Any]:
        return page(fetch(url, policy), format, policy.max_bytes)

    return tool_from_schema(
        name=name,
        description=description,
        parameters={
            "type": "object",
            "properties": {
                "url": {"type": "string", "minLength": 1, "maxLength": 2048,
                        "description": "An absolute http or https URL."},
                "format": {"enum": ["markdown", "text"], "default": "markdown"},
            },
            "required": ["url"],
            "additionalProperties": False,
        },
        fn=read_page,
        read_only=True,
        timeout_secs=policy.timeout_secs * 2 + 30,  # the fetch's own deadline, then extraction
        queue=queue,
        max_concurrency=max_concurrency,
    )


def web_search(
    provider: SearchProvider,
    *,
    name: str = "web_search",
    description: str = WEB_SEARCH_DESCRIPTION,
    max_results: int = 10,
    queue: str = DEFAULT_QUEUE,
    max_concurrency: int | None = None,
) -> Tool[..., Any]:
    """A read-only search tool over ``provider`` (``SearxNG(...)``, ``BraveSearch(...)`` or your own)."""
    if not isinstance(provider, SearchProvider):
        raise TypeError(f"{provider!r} is not a search provider (it needs search(query, count))")
    if not 1 <= max_results <= 50:
        raise ValueError(f"max_results must be 1..50, not {max_results}")

    def search(query: str, count: int = min(5, max_results)) -> dict[str, Any]:
        hits = provider.search(query, count)
        return {"query": query, "results": [h.model_dump() for h in hits[:count]]}

    return tool_from_schema(
        name=name,
        description=description,
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 500},
                "count": {"type": "integer", "minimum": 1, "maximum": max_results,
                          "default": min(5, max_results)},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        fn=search,
        read_only=True,
        queue=queue,
        max_concurrency=max_concurrency,
    )


read_page = page_reader()
"""``read_page`` under the default WebPolicy: public addresses only, robots.txt respected."""
