"""What the HTTP model adapters share: settings from the environment, and a POST with retries.

A request is retried after a network error or a status the provider says is passing (429, 5xx,
Anthropic's 529 "overloaded"), waiting what ``retry-after-ms`` / ``retry-after`` asks (seconds or
an HTTP date, at most 60 s) or else an exponential backoff with jitter. Keys go in headers only,
never into an error message or a log line.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._model import ModelError

if TYPE_CHECKING:
    import httpx

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_RETRY_AFTER_SECS = 60.0


class HTTPModel:
    """A model behind an HTTP API. ``max_attempts`` bounds tries after 429, 5xx and network errors."""

    provider = "http"
    base_url_env = ""
    api_key_env = ""
    default_base_url = ""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_secs: float = 120.0,
        max_attempts: int = 4,
        initial_backoff: float = 0.5,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        import httpx  # here, not with criogenai: only a process that calls a model over HTTP needs it

        if not model:
            raise ValueError(f"name the model: '{self.provider}:MODEL'")
        self.model = model
        self._base_url, self._api_key = base_url, api_key
        self.timeout = httpx.Timeout(timeout_secs, connect=min(10.0, timeout_secs))
        self.max_attempts = max(1, max_attempts)
        self.initial_backoff = initial_backoff
        self.params = dict(params or {})

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.model} at {self.base_url}>"

    @property
    def base_url(self) -> str:
        """From the constructor, else the provider's environment variable, else its public API.
        (The provider's variables, not criogenai's settings: read here, where they are used.)"""
        return (self._base_url or os.environ.get(self.base_url_env) or self.default_base_url).rstrip("/")

    def api_key(self) -> str | None:
        """The key, read at each request; required only by the provider's own public API."""
        key = self._api_key or os.environ.get(self.api_key_env)
        if not key and self.base_url == self.default_base_url.rstrip("/"):
            raise ModelError(
                f"set {self.api_key_env} to use {self.provider} (or {self.base_url_env} for another server)"
            )
        return key

    async def post(self, url: str, headers: dict[str, str], body: dict[str, Any]) -> httpx.Response:
        """POST ``body`` as JSON; the first reply below 400, after retries. Else a ModelError."""
        import httpx

        async with httpx.AsyncClient(timeout=self.timeout) as client:
            for attempt in range(1, self.max_attempts + 1):
                last = attempt == self.max_attempts
                try:
                    response = await client.post(url, headers=headers, json=body)
                except httpx.HTTPError as exc:
                    if last:
                        raise ModelError(f"POST {url}: {type(exc).__name__}: {exc}") from exc
                    await asyncio.sleep(self._wait(attempt, None))
                    continue
                if response.status_code in RETRY_STATUSES and not last:
                    await asyncio.sleep(self._wait(attempt, response.headers))
                    continue
                if response.status_code >= 400:
                    raise ModelError(f"POST {url}: HTTP {response.status_code}: {response.text[:500]}")
                return response
        raise ModelError(f"POST {url}: no reply")  # not reached: the last attempt returns or raises

    def _wait(self, attempt: int, headers: Mapping[str, str] | None) -> float:
        asked = retry_after(headers) if headers is not None else None
        if asked is not None:
            return asked
        base = min(20.0, self.initial_backoff * 2.0 ** (attempt - 1))
        return base * random.uniform(0.75, 1.25)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait a reply asks for: ``retry-after-ms``, or ``retry-after`` in seconds or as a date."""
    try:
        if "retry-after-ms" in headers:
            return _bounded(float(headers["retry-after-ms"]) / 1000.0)
    except ValueError:
        pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return _bounded(float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return _bounded(when.timestamp() - time.time())


def _bounded(secs: float) -> float:
    return min(MAX_RETRY_AFTER_SECS, max(0.0, secs))
