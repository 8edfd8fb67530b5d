"""What an agent says to a model and hears back: message types, the ``Model`` protocol, ``FakeModel``.

Messages are what a model is sent, nothing more: a tool message holds the text the model reads,
never the result's artifact (that stays in the run's records). ``FakeModel`` plays a script of
turns, so an agent can be tested without a model, and keeps every request it was sent.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import Field
from pydantic_core import PydanticSerializationError

from .._errors import ModelError as ModelError
from .._wire import MAX_CALL_ID_CHARS, ToolCall, ToolDefinition, ToolResult, Versioned
from ..tools._content import replace_surrogates


class SystemMessage(Versioned):
    """The agent's instructions."""

    role: Literal["system"] = "system"
    content: str


class UserMessage(Versioned):
    """The prompt a run starts with."""

    role: Literal["user"] = "user"
    content: str


class AssistantMessage(Versioned):
    """One model turn: text, tool calls, or both. No calls means the model has answered."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


def model_call_id(raw: object) -> str:
    """The id a model gave a call when it can be one (printable, at most ``MAX_CALL_ID_CHARS``);
    else an id made from it, the same each time, so one odd id does not end the run: the run, and
    the model's next request, then know the call by that id. A missing id gets a new one."""
    text = "" if raw is None else str(raw)
    if not text:
        return f"call_{uuid.uuid4().hex[:12]}"
    if text.isprintable() and len(text) <= MAX_CALL_ID_CHARS:
        return text
    return "call_" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def utf8_safe(reply: AssistantMessage) -> AssistantMessage:
    """``reply`` with every lone surrogate replaced by U+FFFD, as a UTF-8 decoder replaces a bad
    sequence. A model can write one as a JSON escape (``"\\ud800"``) in its text, a tool's name or
    arguments; no run record or next request could carry it, so the run would end in an error."""
    try:
        reply.model_dump_json()
        return reply
    except PydanticSerializationError:
        pass
    text = json.dumps(reply.model_dump(), ensure_ascii=False)
    return AssistantMessage.model_validate_json(replace_surrogates(text))


class ToolMessage(Versioned):
    """One call's outcome as the model reads it: ``content`` is exactly the text it is sent."""

    role: Literal["tool"] = "tool"
    call_id: str
    name: str
    status: str
    content: str

    @classmethod
    def of(cls, result: ToolResult, call_id: str) -> ToolMessage:
        """The model's view of a result, under the model's own id for the call."""
        return cls(call_id=call_id, name=result.name, status=result.status, content=result.content)


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


ToolSpec = ToolDefinition
"""A tool as a model is offered it: its ``ToolDefinition`` (``Tool.definition``), the one model of a
tool that the catalog and approvals use too. Adapters send its name, description and parameters."""


class ModelRequest(Versioned):
    """Everything a model was sent in one round."""

    messages: list[Message]
    tools: list[ToolDefinition]

    @property
    def tool_results(self) -> dict[str, str]:
        """The tool messages since the last assistant message (this round's news), by call id."""
        news: dict[str, str] = {}
        for m in reversed(self.messages):
            if isinstance(m, AssistantMessage):
                break
            if isinstance(m, ToolMessage):
                news[m.call_id] = m.content
        return dict(reversed(news.items()))


@runtime_checkable
class Model(Protocol):
    """Anything that answers a conversation with one assistant turn."""

    async def complete(self, request: ModelRequest) -> AssistantMessage:
        """One round: the conversation so far and the tools on offer in, the model's turn out."""
        ...


TurnLike = str | AssistantMessage | Sequence[ToolCall | Mapping[str, Any]]
ScriptItem = TurnLike | Callable[[ModelRequest], TurnLike]


def as_turn(item: TurnLike) -> AssistantMessage:
    """A script item as an assistant turn: text answers, a list of calls asks for tools."""
    if isinstance(item, AssistantMessage):
        return item
    if isinstance(item, str):
        return AssistantMessage(content=item)
    calls = [c if isinstance(c, ToolCall) else ToolCall.model_validate(dict(c)) for c in item]
    if not calls:
        raise ValueError("a scripted turn of tool calls needs at least one call")
    return AssistantMessage(tool_calls=calls)


class FakeModel:
    """A model that plays a script, for tests and demos: ``FakeModel([[call, call], "answer"])``.

    Round ``i`` of a run answers with ``script[i]`` (counted from the run's own messages, so a
    retried run or a second run starts where the conversation is, not where this object was).
    An item is a final text, a list of tool calls (``ToolCall`` or ``{"id", "name", "arguments"}``),
    an ``AssistantMessage``, or a function of the ``ModelRequest`` returning one of those. With no
    script the model answers each prompt with the prompt itself. ``requests`` holds every request.
    """

    def __init__(self, script: Sequence[ScriptItem] | None = None) -> None:
        self.script: list[ScriptItem] | None = list(script) if script is not None else None
        self.requests: list[ModelRequest] = []
        self._lock = threading.Lock()

    async def complete(self, request: ModelRequest) -> AssistantMessage:
        with self._lock:
            self.requests.append(request)
        round_no = sum(isinstance(m, AssistantMessage) for m in request.messages)
        if self.script is None:
            prompt = next((m.content for m in request.messages if isinstance(m, UserMessage)), "")
            return AssistantMessage(content=prompt)
        if round_no >= len(self.script):
            raise ModelError(
                f"FakeModel's script has {len(self.script)} turn(s); round {round_no + 1} has none"
            )
        item = self.script[round_no]
        return as_turn(item(request) if callable(item) else item)

    def __repr__(self) -> str:
        turns = "echo" if self.script is None else f"{len(self.script)} turns"
        return f"<FakeModel {turns}, {len(self.requests)} requests>"
