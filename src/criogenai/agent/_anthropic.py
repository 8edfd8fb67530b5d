"""The Anthropic Messages API adapter: ``Agent("anthropic:MODEL")``.

The base URL comes from ``ANTHROPIC_BASE_URL`` (default ``https://api.anthropic.com``; the adapter
posts to ``/v1/messages`` under it, as the SDK does) and the key from ``ANTHROPIC_API_KEY``, read
at each request. System messages go in ``system``; the model's calls are ``tool_use`` blocks, and
each turn's results go back in one user message of ``tool_result`` blocks, in call order, with
``is_error`` set for every status but ``ok``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._wire import ToolCall
from ..tools._shapes import anthropic_tool
from ._http import HTTPModel
from ._model import (
    AssistantMessage,
    Message,
    ModelError,
    ModelRequest,
    SystemMessage,
    ToolMessage,
    model_call_id,
)

if TYPE_CHECKING:
    import httpx

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096


class AnthropicModel(HTTPModel):
    """A Messages API model. ``max_attempts`` bounds tries after 429, 529, 5xx and network errors;
    ``max_tokens`` (required by the API) is 4096 unless ``params`` says otherwise."""

    provider = "anthropic"
    base_url_env = "ANTHROPIC_BASE_URL"
    api_key_env = "ANTHROPIC_API_KEY"
    default_base_url = DEFAULT_BASE_URL

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "anthropic-version": API_VERSION}
        key = self.api_key()
        if key:
            headers["x-api-key"] = key
        return headers

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for one round, in the Messages API wire format."""
        body: dict[str, Any] = {"max_tokens": DEFAULT_MAX_TOKENS, **self.params, "model": self.model}
        system = "\n\n".join(m.content for m in request.messages if isinstance(m, SystemMessage))
        if system:
            body["system"] = system
        body["messages"] = wire_messages(request.messages)
        if request.tools:
            body["tools"] = [anthropic_tool(t.name, t.description, t.parameters) for t in request.tools]
        return body

    async def complete(self, request: ModelRequest) -> AssistantMessage:
        response = await self.post(f"{self.base_url}/v1/messages", self._headers(), self.body(request))
        return parse_reply(response)


def wire_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation as alternating user and assistant messages of content blocks."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, SystemMessage):
            continue
        role, blocks = _blocks(m)
        if out and out[-1]["role"] == role:  # a turn's tool results share one user message
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def _blocks(m: Message) -> tuple[str, list[dict[str, Any]]]:
    if isinstance(m, ToolMessage):
        block = {"type": "tool_result", "tool_use_id": m.call_id, "content": m.content}
        return "user", [{**block, "is_error": m.status != "ok"}]
    if isinstance(m, AssistantMessage):
        blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)} for c in m.tool_calls]
        return "assistant", blocks
    assert not isinstance(m, SystemMessage)
    return "user", [{"type": "text", "text": m.content}]


def _input(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as a ``tool_use`` input, which must be an object."""
    arguments = call.arguments
    if isinstance(arguments, str):  # only another provider's model sends a string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return {}
    return dict(arguments) if isinstance(arguments, Mapping) else {}


def parse_reply(response: httpx.Response) -> AssistantMessage:
    """A Messages API reply as an assistant turn: its text blocks joined, its ``tool_use`` blocks
    as calls (parallel tool use is several of them); a malformed reply is a ModelError."""
    try:
        data = response.json()
        if data.get("type") != "message":
            raise ValueError("not a message")
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in data["content"]:
            if block["type"] == "text":
                texts.append(block["text"])
            elif block["type"] == "tool_use":
                calls.append(ToolCall(id=model_call_id(block["id"]), name=str(block["name"]),
                                      arguments=block["input"]))
        return AssistantMessage(content="".join(texts) or None, tool_calls=calls)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # nested too deep
        raise ModelError(f"not a Messages API reply: {response.text[:300]}") from exc
