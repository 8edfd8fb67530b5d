"""Embeddings through an OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM, llama.cpp,
Ollama...), over httpx like the chat adapter: base URL from ``OPENAI_BASE_URL``, key from
``OPENAI_API_KEY``, 429, 5xx and network errors retried a bounded number of times."""

from __future__ import annotations

import os
import random
import time
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import EmbeddingError as EmbeddingError

if TYPE_CHECKING:
    import httpx

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class Embedder(Protocol):
    """Turns texts into vectors (one per text, in order)."""

    def embed(self, texts: list[str]) -> list[list[float]]: ...


class OpenAIEmbeddings:
    """``model`` at ``base_url`` (or ``OPENAI_BASE_URL``); ``max_attempts`` bounds tries."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_secs: float = 30.0,
        max_attempts: int = 3,
        initial_backoff: float = 0.2,
    ) -> None:
        import httpx  # here, not with criogenai: only a process that embeds needs it

        if not model:
            raise ValueError("name the embedding model")
        self.model = model
        self._base_url, self._api_key = base_url, api_key
        self.timeout = httpx.Timeout(timeout_secs, connect=min(10.0, timeout_secs))
        self.max_attempts = max(1, max_attempts)
        self.initial_backoff = initial_backoff

    def __repr__(self) -> str:
        return f"<OpenAIEmbeddings {self.model} at {self.base_url}>"

    @property
    def base_url(self) -> str:
        # OPENAI_*: the provider's own variables, as its SDK reads them; not criogenai settings.
        return (self._base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text. Raises EmbeddingError once the attempts are spent."""
        if not texts:
            return []
        import httpx

        key = self._api_key or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": self.model, "input": texts}
        problem = ""
        with httpx.Client(timeout=self.timeout, headers=headers) as client:
            for attempt in range(self.max_attempts):
                if attempt:
                    time.sleep(self.initial_backoff * 2 ** (attempt - 1) * (0.75 + random.random() / 2))
                try:
                    response = client.post(f"{self.base_url}/embeddings", json=body)
                except httpx.HTTPError as exc:
                    problem = f"{type(exc).__name__}"
                    continue
                if response.status_code in _RETRY_STATUSES:
                    problem = f"HTTP {response.status_code}"
                    continue
                if response.status_code >= 400:
                    raise EmbeddingError(
                        f"the embeddings server refused the request: HTTP {response.status_code}"
                    )
                return _vectors(response, len(texts))
        raise EmbeddingError(f"no embeddings after {self.max_attempts} attempts: {problem}")


def _vectors(response: httpx.Response, count: int) -> list[list[float]]:
    try:
        data: Any = response.json()["data"]
        ordered = sorted(data, key=lambda d: d["index"])
        vectors = [[float(x) for x in d["embedding"]] for d in ordered]
    except (ValueError, KeyError, TypeError) as exc:
        raise EmbeddingError(f"the embeddings server's answer is not an embeddings list: {exc!r}") from None
    if len(vectors) != count:
        raise EmbeddingError(f"asked for {count} embeddings, got {len(vectors)}")
    return vectors
