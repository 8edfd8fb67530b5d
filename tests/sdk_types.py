"""The official ``openai`` and ``anthropic`` SDKs' types as checks of what crosses the wire.

Requests are checked against the SDKs' request TypedDicts (``MessageCreateParamsNonStreaming``,
``CompletionCreateParamsNonStreaming`` and every TypedDict they use) with pydantic, made strict
for the check: no key the SDK does not name, no coercion (``"no"`` is not a bool), and no block
that fits only a response model.
Replies are parsed by the SDKs' own response models (``Message``, ``ChatCompletion``).
"""

from __future__ import annotations

import functools
import typing
from typing import Any

import pydantic
from anthropic.types import Message
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from openai.types.chat import ChatCompletion
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from typing_extensions import is_typeddict

_STRICT = pydantic.ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)


def _make_strict(root: Any, seen: set[int] | None = None) -> None:
    """Give every TypedDict reachable from ``root``'s type hints a strict pydantic config."""
    seen = set() if seen is None else seen
    if id(root) in seen:
        return
    seen.add(id(root))
    if is_typeddict(root):
        root.__pydantic_config__ = _STRICT
        for hint in typing.get_type_hints(root).values():
            _make_strict(hint, seen)
    for arg in typing.get_args(root):
        _make_strict(arg, seen)


@functools.cache
def _adapter(kind: str) -> pydantic.TypeAdapter[Any]:
    root: Any = MessageCreateParamsNonStreaming if kind == "anthropic" else CompletionCreateParamsNonStreaming
    _make_strict(root)
    return pydantic.TypeAdapter(root)


def _drain(value: Any, where: str = "") -> Any:
    """Walk a validated value: pydantic checks ``Iterable`` fields only as they are iterated."""
    if isinstance(value, pydantic.BaseModel):
        raise AssertionError(f"{where or 'body'} fits only the response model {type(value).__name__}")
    if isinstance(value, dict):
        return {k: _drain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, str | bytes | int | float | bool | None):
        return value
    return [_drain(v, f"{where}[{i}]") for i, v in enumerate(value)]


def check_anthropic_request(body: dict[str, Any]) -> None:
    """Raise unless ``body`` is a valid ``messages.create`` body by the ``anthropic`` SDK's types."""
    _drain(_adapter("anthropic").validate_python(body))


def check_openai_request(body: dict[str, Any]) -> None:
    """Raise unless ``body`` is a valid ``chat.completions.create`` body by the ``openai`` SDK's types."""
    _drain(_adapter("openai").validate_python(body))


def check_anthropic_reply(body: dict[str, Any]) -> Message:
    return Message.model_validate(body)


def check_openai_reply(body: dict[str, Any]) -> ChatCompletion:
    return ChatCompletion.model_validate(body)
