"""Search providers for the ``web_search`` tool: SearxNG's JSON API (self-hosted) and Brave Search.

A provider's endpoint and key are the application's, so its requests are not subject to a
WebPolicy (a SearxNG instance usually sits on a private address). Keys travel in headers only,
never in URLs, logs, errors or results; error messages name the HTTP status, never a body.
"""

from __future__ import annotations

import html
import json
import os
import re
from typing import Any, Protocol, runtime_checkable

import httpx
from pydantic import BaseModel, ConfigDict

from .._errors import ConfigurationError, ToolError
from ..tools._content import plain
from ._policy import DEFAULT_USER_AGENT

_MAX_RESPONSE_BYTES = 2_000_000
_TAG = re.compile(r"<[^>]{0,200}>")


class SearchResult(BaseModel):
    """One hit, as the model gets it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    title: str
    url: str
    snippet: str


@runtime_checkable
class SearchProvider(Protocol):
    """Anything with ``search(query, count) -> list[SearchResult]``; raise ToolError on failure."""

    def search(self, query: str, count: int) -> list[SearchResult]: ...


class SearxNG:
    """A SearxNG instance's JSON API (``/search?format=json``; enable ``json`` under
    ``search.formats`` in its settings.yml)."""

    def __init__(self, base_url: str, *, timeout_secs: float = 10.0, language: str | None = None,
                 safesearch: int = 1) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"SearxNG base_url must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_secs = timeout_secs
        self.language = language
        self.safesearch = safesearch

    def __repr__(self) -> str:
        return f"SearxNG({self.base_url!r})"

    def search(self, query: str, count: int) -> list[SearchResult]:
        params: dict[str, str | int] = {"q": query, "format": "json", "safesearch": self.safesearch}
        if self.language:
            params["language"] = self.language
        data = _get_json(f"{self.base_url}/search", params, {}, self.timeout_secs, "SearxNG")
        results = data.get("results") if isinstance(data, dict) else None
        return [
            SearchResult(title=_text(r.get("title")), url=plain(r["url"]), snippet=_text(r.get("content")))
            for r in (results if isinstance(results, list) else [])
            if isinstance(r, dict) and isinstance(r.get("url"), str)
        ][:count]


class BraveSearch:
    """Brave's hosted Web Search API. The key is ``api_key`` or ``BRAVE_SEARCH_API_KEY``."""

    DEFAULT_BASE_URL = "https://api.search.brave.com/res/v1"

    def __init__(self, api_key: str | None = None, *, base_url: str = DEFAULT_BASE_URL,
                 timeout_secs: float = 10.0, country: str | None = None) -> None:
        # The provider's variable (as Brave documents it), not a criogenai setting.
        self._api_key = api_key if api_key is not None else os.environ.get("BRAVE_SEARCH_API_KEY", "")
        if not self._api_key:
            raise ConfigurationError("BraveSearch needs api_key= or BRAVE_SEARCH_API_KEY")
        self.base_url = base_url.rstrip("/")
        self.timeout_secs = timeout_secs
        self.country = country

    def __repr__(self) -> str:
        return f"BraveSearch({self.base_url!r}, api_key=***)"

    def search(self, query: str, count: int) -> list[SearchResult]:
        params: dict[str, str | int] = {"q": query, "count": min(count, 20)}
        if self.country:
            params["country"] = self.country
        headers = {"X-Subscription-Token": self._api_key, "Accept": "application/json"}
        data = _get_json(f"{self.base_url}/web/search", params, headers, self.timeout_secs, "Brave Search")
        web = data.get("web") if isinstance(data, dict) else None
        results = web.get("results") if isinstance(web, dict) else None
        return [
            SearchResult(
                title=_text(r.get("title")), url=plain(r["url"]), snippet=_text(r.get("description"))
            )
            for r in (results if isinstance(results, list) else [])
            if isinstance(r, dict) and isinstance(r.get("url"), str)
        ][:count]


def _text(value: object) -> str:
    """Snippets come with highlighting tags and entities; the model gets plain text (a lone
    surrogate a JSON escape made, written as its escape again: the result must stay UTF-8)."""
    return plain(html.unescape(_TAG.sub("", value)).strip()) if isinstance(value, str) else ""


def _get_json(url: str, params: dict[str, str | int], headers: dict[str, str], timeout: float,
              provider: str) -> Any:
    try:
        with (
            httpx.Client(timeout=timeout, follow_redirects=False,
                         headers={"User-Agent": DEFAULT_USER_AGENT, **headers}) as client,
            client.stream("GET", url, params=params) as response,
        ):
            if response.status_code != 200:
                retry = response.status_code == 429 or response.status_code >= 500
                raise ToolError(f"{provider} answered HTTP {response.status_code}", retryable=retry)
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > _MAX_RESPONSE_BYTES:
                    raise ToolError(f"{provider} sent more than {_MAX_RESPONSE_BYTES} bytes")
    except httpx.TimeoutException:
        raise ToolError(f"{provider} timed out", retryable=True) from None
    except httpx.TransportError as exc:
        raise ToolError(f"{provider} could not be reached: {type(exc).__name__}", retryable=True) from None
    try:
        return json.loads(bytes(body))
    except (ValueError, RecursionError):  # not JSON, or nested past what Python parses
        raise ToolError(f"{provider} did not answer with JSON") from None
