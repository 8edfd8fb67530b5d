"""Checking a turn before anything is enqueued: unknown tools, invalid arguments, sizes."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .._config import Limits
from .._outcomes import invalid_arguments
from .._wire import ToolCall, ToolResult, ToolStatus
from ..tools import InvalidArguments, Tool, ToolRegistry


@dataclass(frozen=True, slots=True)
class ValidCall:
    call: ToolCall
    tool: Tool[..., Any]


def coerce_calls(calls: Iterable[ToolCall | Mapping[str, Any]]) -> list[ToolCall]:
    """Accept ToolCall objects or dicts with ``id``, ``name`` and ``arguments``."""
    out: list[ToolCall] = []
    for c in calls:
        if isinstance(c, ToolCall):
            out.append(c)
            continue
        try:
            out.append(ToolCall.model_validate(c))
        except ValidationError as exc:
            raise ValueError(f"not a tool call: {c!r}: {exc}") from exc
    return out


def refused(
    call: ToolCall, run_id: str, status: ToolStatus, content: str, artifact: dict[str, Any] | None = None
) -> ToolResult:
    return ToolResult(
        call_id=call.id,
        name=call.name,
        run_id=run_id,
        status=status,
        content=content,
        artifact=artifact,
    )


def _too_large(arguments: Any, limit: int) -> int | None:
    try:
        size = len(json.dumps(arguments, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError, RecursionError):
        return None  # not JSON: validation reports it
    return size if size > limit else None


def check_turn(
    calls: list[ToolCall], registry: ToolRegistry, limits: Limits, run_id: str
) -> tuple[list[ValidCall], dict[str, ToolResult]]:
    """Split a turn into calls to run and results for calls refused before any code runs."""
    valid: list[ValidCall] = []
    done: dict[str, ToolResult] = {}
    if len(calls) > limits.max_calls_per_turn:
        for c in calls:
            done[c.id] = _problem(
                c,
                run_id,
                f"the turn has {len(calls)} calls; at most "
                f"{limits.max_calls_per_turn} are allowed in one turn",
            )
        return [], done
    seen: set[str] = set()
    for c in calls:
        if c.id in seen:
            raise ValueError(f"two calls of one turn have the id {c.id!r}; call ids must be unique")
        seen.add(c.id)
        tool = registry.get(c.name)
        if tool is None:
            names = ", ".join(registry.names()) or "(none)"
            done[c.id] = refused(
                c,
                run_id,
                "unknown_tool",
                f"Unknown tool {c.name!r}. Available tools: {names}.",
                {"available": registry.names()},
            )
            continue
        size = _too_large(c.arguments, limits.max_argument_bytes)
        if size is not None:
            done[c.id] = _problem(
                c,
                run_id,
                f"the arguments are {size} bytes of JSON; at most {limits.max_argument_bytes} are allowed",
            )
            continue
        checked = tool.validate(c.arguments)
        if isinstance(checked, InvalidArguments):
            out = invalid_arguments(c.name, checked.problems)
            done[c.id] = refused(c, run_id, "invalid_arguments", out.content, out.artifact)
            continue
        valid.append(ValidCall(c, tool))
    return valid, done


def _problem(call: ToolCall, run_id: str, problem: str) -> ToolResult:
    out = invalid_arguments(call.name, [f"arguments: {problem}"])
    return refused(call, run_id, "invalid_arguments", out.content, out.artifact)
