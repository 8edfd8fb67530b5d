"""The OpenAI-compatible chat-completions adapter: ``Agent("openai:MODEL")``.

Works with OpenAI and with local servers that speak the same API (vLLM, llama.cpp, Ollama...):
the base URL comes from ``OPENAI_BASE_URL`` and the key from ``OPENAI_API_KEY``, read at each
request. Tools are sent as function tools; tool calls come back with their arguments as a JSON
string, and a string that is not JSON is kept as is, so the agent answers it as invalid arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import uuid
from collections.abc import Mapping
from typing import Any

import httpx

from .._wire import ToolCall
from ._model import AssistantMessage, Message, ModelError, ModelRequest, SystemMessage, ToolSpec, UserMessage

DEFAULT_BASE_URL = "https://api.openai.com/v1"
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class OpenAIModel:
    """A chat-completions model. ``max_attempts`` bounds tries after 429, 5xx and network errors."""

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
        if not model:
            raise ValueError("name the model: 'openai:MODEL'")
        self.model = model
        self._base_url, self._api_key = base_url, api_key
        self.timeout = httpx.Timeout(timeout_secs, connect=min(10.0, timeout_secs))
        self.max_attempts = max(1, max_attempts)
        self.initial_backoff = initial_backoff
        self.params = dict(params or {})

    def __repr__(self) -> str:
        return f"<OpenAIModel {self.model} at {self.base_url}>"

    @property
    def base_url(self) -> str:
        return (self._base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")

    def _headers(self) -> dict[str, str]:
        key = self._api_key or os.environ.get("OPENAI_API_KEY")
        if not key and self.base_url == DEFAULT_BASE_URL:
            raise ModelError("set OPENAI_API_KEY to use OpenAI (or OPENAI_BASE_URL for a local server)")
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for one round, in the chat-completions wire format."""
        body: dict[str, Any] = {**self.params, "model": self.model}
        body["messages"] = [wire_message(m) for m in request.messages]
        if request.tools:
            body["tools"] = [wire_tool(t) for t in request.tools]
        return body

    async def complete(self, request: ModelRequest) -> AssistantMessage:
        url = f"{self.base_url}/chat/completions"
        headers, body = self._headers(), self.body(request)
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
                    await asyncio.sleep(self._wait(attempt, response.headers.get("retry-after")))
                    continue
                if response.status_code >= 400:
                    raise ModelError(f"POST {url}: HTTP {response.status_code}: {response.text[:500]}")
                return parse_reply(response)
        raise ModelError(f"POST {url}: no reply")  # not reached: the last attempt returns or raises

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(30.0, max(0.0, float(retry_after)))
            except ValueError:
                pass
        base = min(20.0, self.initial_backoff * 2.0 ** (attempt - 1))
        return base * random.uniform(0.75, 1.25)


def wire_tool(t: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


def wire_message(m: Message) -> dict[str, Any]:
    """One message as chat-completions takes it; a tool message is its content and call id only."""
    if isinstance(m, SystemMessage | UserMessage):
        return {"role": m.role, "content": m.content}
    if isinstance(m, AssistantMessage):
        out: dict[str, Any] = {"role": "assistant", "content": m.content}
        if m.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.name,
                        # What the model sent, as it sent it, when that was not a JSON object.
                        "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments),
                    },
                }
                for c in m.tool_calls
            ]
        return out
    return {"role": "tool", "tool_call_id": m.call_id, "content": m.content}


def parse_reply(response: httpx.Response) -> AssistantMessage:
    """The first choice's message as an assistant turn; a malformed reply is a ModelError."""
    try:
        data = response.json()
        message = data["choices"][0]["message"]
        calls = [_call(c) for c in message.get("tool_calls") or []]
        content = message.get("content")
        return AssistantMessage(content=content if isinstance(content, str) else None, tool_calls=calls)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ModelError(f"not a chat-completions reply: {response.text[:300]}") from exc


def _call(raw: Mapping[str, Any]) -> ToolCall:
    function = raw.get("function") or {}
    arguments: Any = function.get("arguments")
    if arguments is None or arguments == "":
        arguments = {}
    elif isinstance(arguments, str):
        # Not JSON: kept as the string, and the agent answers the model with invalid_arguments.
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    call_id = raw.get("id") or f"call_{uuid.uuid4().hex[:12]}"
    return ToolCall(id=str(call_id), name=str(function.get("name") or ""), arguments=arguments)
