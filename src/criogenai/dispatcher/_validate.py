"""Checking a turn before anything is enqueued: unknown tools, invalid arguments, sizes."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .._config import Limits
from .._wire import ToolCall, ToolResult, ToolStatus
from ..runner._outcomes import invalid_arguments, unknown_tool
from ..tools import InvalidArguments, Tool, ToolRegistry, cut


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


MAX_PROBLEMS_SHOWN = 50
"""Problems listed for one call; a model needs the first few, and a hostile call can have thousands."""


def _not_json(value: object) -> str | None:
    """Why a leaf value is not JSON, or None when it is."""
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a JSON number"
    return f"a {type(value).__name__} is not a JSON value"


def _shape_problem(arguments: Any, limits: Limits) -> str | None:
    """Why the arguments cannot be sent as they are (too deep, too big, not JSON), or None.

    Walks the value with its own stack and a running lower bound of its JSON size, so that a
    100,000-deep value costs no recursion and a huge one is refused before it is serialized.
    """
    budget, max_depth = limits.max_argument_bytes, limits.max_argument_depth
    too_big = f"the arguments are over {budget} bytes of JSON; at most {budget} are allowed"
    least = 0  # bytes the JSON text has at least
    stack: list[tuple[Any, int]] = [(arguments, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list | tuple):
            if depth > max_depth:
                return f"the arguments nest deeper than {max_depth} levels of objects and arrays"
            least += 1 + 2 * len(value)  # brackets, one separator and one byte at least per item
            if least > budget:
                return too_big
            if isinstance(value, dict):
                for k, item in value.items():
                    if not isinstance(k, str):
                        return f"not JSON: an object key is a {type(k).__name__}, not a string"
                    least += len(k) + 3
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)
        else:
            why = _not_json(value)
            if why is not None:
                return f"not JSON: {why}"
            least += len(value) + 2 if isinstance(value, str) else 1
        if least > budget:
            return too_big
    try:
        size = len(json.dumps(arguments, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError, RecursionError) as exc:  # an int of thousands of digits
        return f"not JSON: {type(exc).__name__}"
    if size > budget:
        return f"the arguments are {size} bytes of JSON; at most {budget} are allowed"
    return None


def _bounded(result: ToolResult, limits: Limits) -> ToolResult:
    """A refusal's text within what the model may be sent."""
    if len(result.content) <= limits.max_result_chars:
        return result
    body = cut(result.content, limits.max_result_chars)
    return result.model_copy(update={"content": body.text, "truncated": True})


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
            out = unknown_tool(c.name, registry.names(), limits.max_result_chars)
            done[c.id] = refused(c, run_id, "unknown_tool", out.content, out.artifact).model_copy(
                update={"truncated": out.truncated}
            )
            continue
        shape = _shape_problem(c.arguments, limits)
        if shape is not None:
            done[c.id] = _problem(c, run_id, shape)
            continue
        checked = tool.validate(c.arguments)
        if isinstance(checked, InvalidArguments):
            problems = checked.problems
            if len(problems) > MAX_PROBLEMS_SHOWN:
                more = len(problems) - MAX_PROBLEMS_SHOWN
                problems = [*problems[:MAX_PROBLEMS_SHOWN], f"... and {more} more problem(s)"]
            out = invalid_arguments(c.name, problems)
            done[c.id] = _bounded(refused(c, run_id, "invalid_arguments", out.content, out.artifact), limits)
            continue
        valid.append(ValidCall(c, tool))
    return valid, done


def _problem(call: ToolCall, run_id: str, problem: str) -> ToolResult:
    out = invalid_arguments(call.name, [f"arguments: {problem}"])
    return refused(call, run_id, "invalid_arguments", out.content, out.artifact)
