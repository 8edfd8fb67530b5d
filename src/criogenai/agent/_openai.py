"""The OpenAI-compatible chat-completions adapter: ``Agent("openai:MODEL")``.

Works with OpenAI and with local servers that speak the same API (vLLM, llama.cpp, Ollama...):
the base URL comes from ``OPENAI_BASE_URL`` and the key from ``OPENAI_API_KEY``, read at each
request. Tools are sent as function tools; tool calls come back with their arguments as a JSON
string, and a string that is not JSON is kept as is, so the agent answers it as invalid arguments.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._wire import ToolCall, ToolDefinition
from ..tools._shapes import openai_tool
from ._http import HTTPModel
from ._model import (
    AssistantMessage,
    Message,
    ModelError,
    ModelRequest,
    SystemMessage,
    UserMessage,
    model_call_id,
)

if TYPE_CHECKING:
    import httpx

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIModel(HTTPModel):
    """A chat-completions model. ``max_attempts`` bounds tries after 429, 5xx and network errors;
    ``strict`` sends ``strict: true`` with each tool whose schema allows it (``Tool.openai_strict``)."""

    provider = "openai"
    base_url_env = "OPENAI_BASE_URL"
    api_key_env = "OPENAI_API_KEY"
    default_base_url = DEFAULT_BASE_URL

    def __init__(self, model: str, *, strict: bool = True, **options: Any) -> None:
        super().__init__(model, **options)
        self.strict = strict

    def _headers(self) -> dict[str, str]:
        key = self.api_key()
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for one round, in the chat-completions wire format."""
        body: dict[str, Any] = {**self.params, "model": self.model}
        body["messages"] = [wire_message(m) for m in request.messages]
        if request.tools:
            body["tools"] = [wire_tool(t, strict=self.strict) for t in request.tools]
        return body

    async def complete(self, request: ModelRequest) -> AssistantMessage:
        response = await self.post(f"{self.base_url}/chat/completions", self._headers(), self.body(request))
        return parse_reply(response)


def wire_tool(t: ToolDefinition, *, strict: bool = True) -> dict[str, Any]:
    return openai_tool(t.name, t.description, t.parameters, strict=strict)


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
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
        raise ModelError(f"not a chat-completions reply: {response.text[:300]}") from exc


def _call(raw: Mapping[str, Any]) -> ToolCall:
    function = raw.get("function") or {}
    arguments: Any = function.get("arguments")
    if arguments is None or arguments == "":
        arguments = {}
    elif isinstance(arguments, str):
        # Not JSON (or nested past what Python parses): kept as the string, and the agent answers
        # the model with invalid_arguments.
        with contextlib.suppress(ValueError, RecursionError):
            arguments = json.loads(arguments)
    name = str(function.get("name") or "")
    return ToolCall(id=model_call_id(raw.get("id")), name=name, arguments=arguments)
