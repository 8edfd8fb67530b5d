"""A tool's return value to the text the model reads, cut at the size limit."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from .._wire import DEFAULT_MAX_RESULT_CHARS as DEFAULT_MAX_RESULT_CHARS


@dataclass(frozen=True, slots=True)
class Content:
    """The text sent to the model and whether it was cut."""

    text: str
    truncated: bool
    full_chars: int


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"the tool returned a {type(value).__name__}, which is not a JSON value")


_SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone UTF-16 surrogate: a Python string may hold one, but no UTF-8 text (JSON, Redis, a model's
request) can, so a result holding one could be neither filed nor sent."""


def to_json_text(value: Any) -> str:
    """A string as is; anything else as compact JSON (pydantic models converted). TypeError if not
    JSON, which includes text holding a lone surrogate (``"\\ud800"``, from a bad decode)."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=_to_jsonable, allow_nan=False)
        except ValueError as exc:  # NaN, infinity, or a circular structure
            raise TypeError(f"the result is not valid JSON: {exc}") from exc
    bad = _SURROGATE.search(text)
    if bad is not None:
        where = f"U+{ord(bad.group()):04X}"
        raise TypeError(f"the result is not valid JSON: it holds a lone surrogate ({where}), "
                        "which no UTF-8 text can carry")
    return text


def replace_surrogates(text: str) -> str:
    """``text`` with any lone surrogate replaced by U+FFFD, as a UTF-8 decoder replaces a bad byte."""
    return _SURROGATE.sub("\ufffd", text)


def plain(text: str) -> str:
    """``text`` with any lone surrogate written as its escape (``\\ud800``): a message or traceback
    that can be stored and sent as UTF-8."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def cut(text: str, max_chars: int = DEFAULT_MAX_RESULT_CHARS) -> Content:
    """Cut ``text`` to at most ``max_chars`` characters, ending with a visible marker when cut."""
    if len(text) <= max_chars:
        return Content(text, False, len(text))
    marker = f"\n[... cut: the result had {len(text):,} characters, the limit is {max_chars:,}]"
    keep = max(0, max_chars - len(marker))
    return Content((text[:keep] + marker)[:max_chars], True, len(text))


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A tool's value for the model plus what only the run keeps (an MCP result's images, say)."""

    value: Any
    artifact: dict[str, Any] | None
