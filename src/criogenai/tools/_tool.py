"""Tool: a function the model may call, with the JSON Schema it sees and a validator for its calls."""

from __future__ import annotations

import copy
import functools
import inspect
import re
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NoReturn, ParamSpec, TypeVar, overload

from pydantic import BaseModel, ValidationError

from .._errors import ToolDefinitionError, ToolError
from .._keys import DEFAULT_QUEUE as DEFAULT_QUEUE
from .._wire import ToolDefinition
from ._context import ToolContext
from ._schema import build_function_schema
from ._shapes import anthropic_tool, openai_strict_ok, openai_tool

if TYPE_CHECKING:
    import jsonschema

P = ParamSpec("P")
R = TypeVar("R")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class ValidArguments:
    """Arguments that passed the schema, ready to call the function with."""

    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class InvalidArguments:
    """Every problem found in a call's arguments, each naming where it is and what is wrong."""

    problems: list[str]


class Tool(Generic[P, R]):
    """A function the model may call: its name, description, JSON Schema, flags and validator.

    Calling the tool object calls the function directly, which keeps tools easy to unit-test.
    """

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str,
        description: str,
        parameters: dict[str, Any],
        model: type[BaseModel] | None,
        context_param: str | None,
        read_only: bool = False,
        idempotent: bool = False,
        destructive: bool = False,
        timeout_secs: float | None = None,
        queue: str = DEFAULT_QUEUE,
        max_concurrency: int | None = None,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ToolDefinitionError(f"tool name {name!r}: use 1 to 64 letters, digits, '_' or '-'")
        if destructive and (read_only or idempotent):
            raise ToolDefinitionError(
                f"tool {name!r}: a destructive tool cannot also be read_only or idempotent"
            )
        if timeout_secs is not None and not timeout_secs > 0:
            raise ToolDefinitionError(f"tool {name!r}: timeout_secs must be > 0, not {timeout_secs}")
        if max_concurrency is not None and max_concurrency < 1:
            raise ToolDefinitionError(f"tool {name!r}: max_concurrency must be >= 1, not {max_concurrency}")
        validator_class = _checked_validator_class(name, parameters)
        if parameters.get("type") != "object":
            raise ToolDefinitionError(f"tool {name!r}: the parameters schema must have type 'object'")
        try:
            self._definition = ToolDefinition(
                name=name,
                description=description,
                parameters=parameters,
                read_only=read_only,
                idempotent=idempotent,
                destructive=destructive,
                timeout_secs=timeout_secs,
                queue=queue,
            )
        except ValidationError as exc:
            raise ToolDefinitionError(f"tool {name!r}: {exc}") from exc
        self.fn = fn
        self.max_concurrency = max_concurrency
        """Calls of this tool running at once across the whole fleet (kept in Redis), or no limit."""
        self.is_async = inspect.iscoroutinefunction(fn)
        self._model = model
        self._context_param = context_param
        self._validator_class = validator_class

    @functools.cached_property
    def _validator(self) -> Any:
        """The validator of the arguments, made on the tool's first call rather than at definition."""
        return self._validator_class(_inlined(self._definition.parameters))

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.name}>"

    @property
    def definition(self) -> ToolDefinition:
        """What the model and the engine know of the tool (name, description, JSON Schema, flags,
        queue): a copy, so changing it changes nothing the tool validates against."""
        return self._definition.model_copy(deep=True)

    @property
    def name(self) -> str:
        return self._definition.name

    @property
    def description(self) -> str:
        return self._definition.description

    @property
    def read_only(self) -> bool:
        return self._definition.read_only

    @property
    def idempotent(self) -> bool:
        return self._definition.idempotent

    @property
    def destructive(self) -> bool:
        return self._definition.destructive

    @property
    def timeout_secs(self) -> float | None:
        return self._definition.timeout_secs

    @property
    def queue(self) -> str:
        return self._definition.queue

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the arguments, exactly as the model sees it (a copy: changing it
        changes nothing the tool validates against)."""
        return copy.deepcopy(self._definition.parameters)

    @property
    def anthropic_definition(self) -> dict[str, Any]:
        """The tool as Anthropic's Messages API takes it (``name``, ``description``, ``input_schema``)."""
        return anthropic_tool(self.name, self.description, self.schema)

    @property
    def openai_definition(self) -> dict[str, Any]:
        """The tool as OpenAI's chat-completions API takes it, ``strict: true`` where the schema allows."""
        return openai_tool(self.name, self.description, self.schema, strict=True)

    @property
    def openai_strict(self) -> bool:
        """Whether OpenAI's strict mode accepts this tool's schema (closed objects, all required)."""
        return openai_strict_ok(self._definition.parameters)

    @property
    def retryable(self) -> bool:
        """Read-only and idempotent tools may be run again; other tools never are."""
        return self._definition.retryable

    @property
    def schema_hash(self) -> str:
        """A short hash of the definition, to tell two versions of a tool apart."""
        return self._definition.schema_hash

    def validate(self, arguments: object) -> ValidArguments | InvalidArguments:
        """Check arguments against the schema (then the model's own validators); never raises."""
        problems = _schema_problems(self._validator, arguments)
        if problems or not isinstance(arguments, dict):
            return InvalidArguments(problems)
        if self._model is None:
            return ValidArguments(dict(arguments))
        try:
            instance = self._model.model_validate(arguments)
        except ValidationError as exc:
            return InvalidArguments([_pydantic_problem(err) for err in exc.errors()])
        except ToolError as exc:  # a validator's message for the model, as from the tool itself
            return InvalidArguments([f"arguments: {exc.message}"])
        except Exception as exc:
            # Pydantic lets anything but ValueError and AssertionError out of a validator; it is the
            # tool's code failing, and its text may hold what the model must not see: the type only.
            return InvalidArguments([f"arguments: a validator of this tool raised {type(exc).__name__}"])
        return ValidArguments({k: getattr(instance, k) for k in type(instance).model_fields})

    def invoke(self, kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        """Call the function with validated arguments and, if it asks for one, the context."""
        if self._context_param is not None:
            kwargs = {**kwargs, self._context_param: ctx}
        fn: Callable[..., Any] = self.fn
        return fn(**kwargs)


def argument_problems(parameters: dict[str, Any], arguments: object) -> list[str]:
    """Every problem of ``arguments`` against a tool's JSON Schema (empty when they fit), worded as
    ``Tool.validate`` words them: for a process that has a tool's definition but not its code."""
    return _schema_problems(_validator_class(parameters)(_inlined(parameters)), arguments)


def _schema_problems(validator: Any, arguments: object) -> list[str]:
    if not isinstance(arguments, dict):
        return [f"arguments: expected a JSON object, got {_json_type(arguments)}"]
    errors = list(validator.iter_errors(arguments))
    return [_jsonschema_problem(e) for e in _leaf_errors(errors)] if errors else []


def remote_tool(definition: ToolDefinition) -> Tool[..., Any]:
    """A tool known only by its definition (from the fleet's catalog): it validates calls exactly
    as its workers do, and runs on them; calling it in this process raises."""
    name = definition.name

    def run_on_the_fleet(**_: Any) -> NoReturn:
        raise RuntimeError(f"tool {name!r} runs on the workers; this process has only its definition")

    return Tool(
        run_on_the_fleet,
        name=name,
        description=definition.description,
        parameters=definition.parameters,
        model=None,
        context_param=None,
        read_only=definition.read_only,
        idempotent=definition.idempotent,
        destructive=definition.destructive,
        timeout_secs=definition.timeout_secs,
        queue=definition.queue,
    )


def _checked_validator_class(name: str, schema: dict[str, Any]) -> Any:
    """``_validator_class``, after checking the schema against that draft's meta-schema."""
    from jsonschema import SchemaError

    validator_class = _validator_class(schema)
    try:
        validator_class.check_schema(schema)
    except SchemaError as exc:
        raise ToolDefinitionError(f"tool {name!r}: invalid JSON Schema: {exc.message}") from exc
    return validator_class


def _validator_class(schema: dict[str, Any]) -> Any:
    """The validator of the draft the schema names in ``$schema`` (MCP servers send draft-07 and
    2020-12 ones), Draft 2020-12 when it names none or one jsonschema does not know. jsonschema is
    imported here, at the first tool's definition, not with criogenai."""
    import jsonschema

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # an unknown $schema: the default
        return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """The same schema with its local ``$defs`` references written in place, for validation only.

    jsonschema resolves a ``$ref`` on every use, which is most of its time on a model's
    arguments; an equal schema without them validates about a fifth faster. A recursive model
    keeps its references.
    """
    defs = schema.get("$defs")
    if not isinstance(defs, dict):
        return schema

    def walk(node: Any, seen: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [walk(x, seen) for x in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs:
            name = ref[8:]
            if name in seen:
                raise RecursionError(name)
            target = walk(defs[name], seen | {name})
            rest = {k: walk(v, seen) for k, v in node.items() if k != "$ref"}
            return {"allOf": [target], **rest} if rest else target
        return {k: walk(v, seen) for k, v in node.items() if k != "$defs"}

    try:
        flat: dict[str, Any] = walk(schema, frozenset())
    except RecursionError:
        return schema
    return flat


def _json_type(value: object) -> str:
    names = {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def _leaf_errors(errors: list[jsonschema.ValidationError]) -> list[jsonschema.ValidationError]:
    """Replace an anyOf/oneOf error by its most specific sub-errors when there is one clear branch."""
    out: list[jsonschema.ValidationError] = []
    for err in errors:
        out.extend(_expand(err))
    return out


def _expand(err: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    if err.validator not in ("anyOf", "oneOf") or not err.context:
        return [err]
    branches: dict[Any, list[jsonschema.ValidationError]] = {}
    for sub in err.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    # A branch that fails only on the value's own type (the null of Optional[X]) is not the one meant.
    meant = [
        subs
        for subs in branches.values()
        if not all(s.validator == "type" and not s.relative_path for s in subs)
    ]
    if len(meant) == 1:
        return [leaf for sub in meant[0] for leaf in _expand(sub)]
    from jsonschema.exceptions import best_match

    best = best_match([err])
    return [best if best is not None else err]


def _where(path: Any) -> str:
    where = ""
    for part in path:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    return where or "arguments"


def _jsonschema_problem(err: jsonschema.ValidationError) -> str:
    return f"{_where(err.absolute_path)}: {err.message}"


def _pydantic_problem(err: Any) -> str:
    return f"{_where(err.get('loc', ()))}: {err.get('msg', 'invalid')}"


# -- the decorator and the explicit form -----------------------------------------------------------


def _make(
    fn: Callable[P, R],
    *,
    name: str | None,
    description: str | None,
    read_only: bool,
    idempotent: bool,
    destructive: bool,
    timeout_secs: float | None,
    queue: str,
    max_concurrency: int | None = None,
) -> Tool[P, R]:
    if not callable(fn):
        raise ToolDefinitionError(f"@tool decorates a function, not {fn!r}")
    tool_name = name if name is not None else getattr(fn, "__name__", "")
    schema = build_function_schema(fn, tool_name)
    doc = description if description is not None else inspect.cleandoc(fn.__doc__ or "")
    return Tool(
        fn,
        name=tool_name,
        description=doc,
        parameters=schema.json_schema,
        model=schema.model,
        context_param=schema.context_param,
        read_only=read_only,
        idempotent=idempotent,
        destructive=destructive,
        timeout_secs=timeout_secs,
        queue=queue,
        max_concurrency=max_concurrency,
    )


@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    destructive: bool = False,
    timeout_secs: float | None = None,
    queue: str = DEFAULT_QUEUE,
    max_concurrency: int | None = None,
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    destructive: bool = False,
    timeout_secs: float | None = None,
    queue: str = DEFAULT_QUEUE,
    max_concurrency: int | None = None,
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Make a function a tool: type hints become the JSON Schema, the docstring the description.

    Use as ``@tool`` or ``@tool(name=..., read_only=True, ...)``. Unsupported hints raise
    ``TypeError`` (``ToolDefinitionError``) here, when the tool is defined. ``max_concurrency``
    caps the tool's calls in flight across the whole fleet (dispatchers enforce it in Redis).
    """
    options = dict(
        name=name,
        description=description,
        read_only=read_only,
        idempotent=idempotent,
        destructive=destructive,
        timeout_secs=timeout_secs,
        queue=queue,
        max_concurrency=max_concurrency,
    )
    if fn is not None:
        return _make(fn, **options)  # type: ignore[arg-type]

    def decorate(f: Callable[P, R]) -> Tool[P, R]:
        return _make(f, **options)  # type: ignore[arg-type]

    return decorate


def tool_from_schema(
    *,
    name: str,
    description: str,
    parameters: dict[str, Any],
    fn: Callable[..., Any] | Callable[..., Awaitable[Any]],
    read_only: bool = False,
    idempotent: bool = False,
    destructive: bool = False,
    timeout_secs: float | None = None,
    queue: str = DEFAULT_QUEUE,
    max_concurrency: int | None = None,
) -> Tool[..., Any]:
    """A tool from an explicit JSON Schema, like the TypeScript ``tool({...})``.

    The schema is checked as Draft 2020-12 at definition. ``fn`` is called with the arguments as
    keyword arguments, plus its ``ToolContext`` parameter if it has one.
    """
    context_param = None
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except Exception:
        hints = {}
    for pname, hint in hints.items():
        if hint is ToolContext:
            context_param = pname
    return Tool(
        fn,
        name=name,
        description=description,
        parameters=parameters,
        model=None,
        context_param=context_param,
        read_only=read_only,
        idempotent=idempotent,
        destructive=destructive,
        timeout_secs=timeout_secs,
        queue=queue,
        max_concurrency=max_concurrency,
    )
