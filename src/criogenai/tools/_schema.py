"""Type hints to a pydantic model and the JSON Schema the model sees, as the Tools page's table says.

Supported: ``str``, ``int``, ``float``, ``bool``, ``Literal[...]``, ``list[X]``, ``dict`` /
``dict[str, X]``, ``Optional[X]`` (``X | None``), pydantic models, ``Any`` or no hint, and
``Annotated[X, Field(...)]`` for constraints. Everything else (sets, tuples, unions of two types,
plain classes, ``datetime``, enums) is refused, so that a schema problem shows at start-up. Every
unsupported hint of a function is reported in one ``ToolDefinitionError``.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, create_model
from pydantic.json_schema import GenerateJsonSchema

from .._errors import ToolDefinitionError
from ._context import ToolContext

_SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class FunctionSchema:
    """What a function's signature becomes: its arguments model, JSON Schema and context parameter."""

    model: type[BaseModel]
    json_schema: dict[str, Any]
    context_param: str | None


class _NoFieldTitles(GenerateJsonSchema):
    """Leaves out the "title" pydantic derives from each field name: noise for a model."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def literal_schema(self, schema: Any) -> Any:
        """A one-value ``Literal`` as a one-item ``enum``, like any other, not ``const``: some
        providers' tool-schema subsets refuse ``const``."""
        out = super().literal_schema(schema)
        if "const" in out and "enum" not in out:
            out["enum"] = [out.pop("const")]
        return out


def _hint_problem(hint: Any) -> str | None:
    """Why ``hint`` cannot be an argument's type, or None when it can."""
    if hint is Any or hint in _SCALARS:
        return None
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return None
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _hint_problem(args[0])
    if origin is Literal:
        bad = [a for a in args if not isinstance(a, str | int | float | bool) and a is not None]
        return f"Literal values must be JSON scalars, not {bad!r}" if bad else None
    if hint is list or origin is list:
        return _hint_problem(args[0]) if args else None
    if hint is dict or origin is dict:
        if not args:
            return None
        if args[0] is not str:
            return "dict keys must be str (JSON object keys are strings)"
        return _hint_problem(args[1])
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return _hint_problem(rest[0])
        return "a union of several types is not supported; use Optional[X] or a Literal"
    return "unsupported type; use str, int, float, bool, Literal, list, dict, Optional or a pydantic model"


def _is_context(hint: Any) -> bool:
    return hint is ToolContext


def build_function_schema(fn: Callable[..., Any], tool_name: str) -> FunctionSchema:
    """Build the arguments model and JSON Schema of ``fn``, or raise one error naming every bad hint."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a NameError in a forward reference, typically
        raise ToolDefinitionError(f"tool {tool_name!r}: cannot resolve type hints: {exc}") from exc

    fields: dict[str, Any] = {}
    problems: list[str] = []
    context_param: str | None = None
    for param in inspect.signature(fn).parameters.values():
        hint = hints.get(param.name, Any)
        if _is_context(hint):
            context_param = param.name
            continue
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            problems.append(
                f"parameter {param.name!r}: *args, **kwargs and positional-only "
                "parameters cannot be described to a model"
            )
            continue
        if param.name.startswith("_"):
            # pydantic takes a leading underscore for a private attribute and drops it from the schema
            problems.append(f"parameter {param.name!r}: a name starting with '_' cannot be an argument")
            continue
        problem = _hint_problem(hint)
        if problem is not None:
            problems.append(f"parameter {param.name!r} has hint {_show(hint)}: {problem}")
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, default)
    if problems:
        raise ToolDefinitionError(f"tool {tool_name!r}: " + "; ".join(problems))

    reserved = sorted(n for n in fields if n == "model_config")
    try:
        model = create_model(
            f"{tool_name}_arguments",
            __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
            **{n: f for n, f in fields.items() if n not in reserved},
        )
    except Exception as exc:
        raise ToolDefinitionError(f"tool {tool_name!r}: its parameters cannot be described: {exc}") from exc
    # pydantic keeps some names for itself and would drop such a parameter from the schema silently
    dropped = reserved + sorted(set(fields) - set(reserved) - set(model.model_fields))
    if dropped:
        raise ToolDefinitionError(
            f"tool {tool_name!r}: parameter name(s) {', '.join(map(repr, dropped))} are reserved by "
            "pydantic; rename them"
        )
    try:
        json_schema = model.model_json_schema(schema_generator=_NoFieldTitles)
    except Exception as exc:
        raise ToolDefinitionError(f"tool {tool_name!r}: no JSON Schema for its arguments: {exc}") from exc
    json_schema.pop("title", None)
    json_schema.setdefault("properties", {})
    return FunctionSchema(model=model, json_schema=json_schema, context_param=context_param)


def _show(hint: Any) -> str:
    # A class by its name; anything else in full (set[int].__name__ is just "set").
    return hint.__name__ if isinstance(hint, type) else repr(hint)
