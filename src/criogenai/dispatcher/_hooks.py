"""Tool hooks: ``before_tool`` lets a call through, changes, blocks or answers it; ``after_tool`` sees
(and may replace) each result. A hook that raises never takes the turn down.

Hooks run in the dispatcher, in the order given, sync or async. Sync hooks run on the caller's
thread, so keep them quick; async hooks are bounded by ``HOOK_TIMEOUT_SECS``.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import threading
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from .._config import Settings
from .._wire import ToolCall, ToolResult
from ..store import CacheStore, make_cache_store
from ..tools import DEFAULT_MAX_RESULT_CHARS, InvalidArguments, Tool, cut, to_json_text
from ._validate import refused

log = logging.getLogger(__name__)

HOOK_TIMEOUT_SECS = 30.0
"""An async hook that takes longer is stopped and counts as raising ``TimeoutError``."""


@dataclass(frozen=True, slots=True)
class HookCall:
    """What a hook sees of a call. ``arguments`` is a copy: change them by returning ``ChangeArguments``."""

    tool_name: str
    arguments: Any
    run_id: str
    call_id: str
    tool: Tool[..., Any] | None = None
    """The tool (its flags, schema); None only for an ``after_tool`` hook seeing an unknown tool."""
    scope: str | None = None
    """The run's scope (``run_turn(..., scope=)``, ``Agent.run(..., user=)``): whose data the call
    touches, so a hook that keeps results (a cache) keeps them apart per scope."""


@dataclass(frozen=True, slots=True)
class Allow:
    """Let the call through unchanged (the same as returning None)."""


@dataclass(frozen=True, slots=True)
class ChangeArguments:
    """Run the call with these arguments instead; they are validated against the schema again."""

    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Block:
    """Do not run the call; the model sees a ``blocked`` result with ``message``."""

    message: str


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the call without running the tool: an ``ok`` result with ``cached=True``.

    ``content`` is any JSON value (a string is sent as is).
    """

    content: Any
    artifact: dict[str, Any] | None = None


BeforeDecision: TypeAlias = Allow | ChangeArguments | Block | Answer | None
BeforeHook: TypeAlias = Callable[[HookCall], BeforeDecision | Awaitable[BeforeDecision]]
AfterHook: TypeAlias = Callable[[HookCall, ToolResult], ToolResult | Awaitable[ToolResult | None] | None]


def hook_name(hook: object) -> str:
    name = getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None)
    return str(name) if name else repr(hook)


def is_async_hook(hook: object) -> bool:
    call = getattr(hook, "__call__", None)  # noqa: B004 - an object with an async __call__ counts
    return inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(call)


async def _call(hook: Callable[..., Any], *args: Any) -> Any:
    out = hook(*args)
    if inspect.isawaitable(out):
        out = await asyncio.wait_for(_awaited(out), HOOK_TIMEOUT_SECS)
    return out


async def _awaited(aw: Awaitable[Any]) -> Any:
    return await aw


def _failure(hook: object, exc: BaseException) -> dict[str, Any]:
    return {
        "hook": hook_name(hook),
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def _copy(arguments: Any) -> Any:
    try:
        return json.loads(json.dumps(arguments))
    except (TypeError, ValueError):
        return arguments


async def run_before(
    hooks: list[BeforeHook],
    call: ToolCall,
    tool: Tool[..., Any],
    run_id: str,
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    scope: str | None = None,
) -> ToolCall | ToolResult:
    """Run the hooks in order: the call to send (maybe with changed arguments), or its result now."""
    for hook in hooks:
        seen = HookCall(call.name, _copy(call.arguments), run_id, call.id, tool, scope)
        try:
            decision = await _call(hook, seen)
            if decision is not None and not isinstance(decision, Allow | ChangeArguments | Block | Answer):
                raise TypeError(
                    f"a before_tool hook returns None, Allow, ChangeArguments, Block or "
                    f"Answer, not {type(decision).__name__}"
                )
        except Exception as exc:
            log.exception("before_tool hook %s raised on call %s/%s", hook_name(hook), run_id, call.id)
            return refused(
                call,
                run_id,
                "blocked",
                f"Tool {call.name!r} was not run: the before_tool hook {hook_name(hook)!r} failed "
                f"({type(exc).__name__}).",
                {"hook_error": _failure(hook, exc)},
            )
        if isinstance(decision, Block):
            return refused(call, run_id, "blocked", decision.message, {"hook": hook_name(hook)})
        if isinstance(decision, Answer):
            try:
                text = to_json_text(decision.content)
            except TypeError as exc:
                return refused(
                    call,
                    run_id,
                    "blocked",
                    f"Tool {call.name!r} was not run: the before_tool "
                    f"hook {hook_name(hook)!r} answered with a value that is not JSON.",
                    {"hook_error": _failure(hook, exc)},
                )
            body = cut(text, max_result_chars)  # an answer is held to the same limit as a result
            return ToolResult(
                call_id=call.id,
                name=call.name,
                run_id=run_id,
                status="ok",
                content=body.text,
                artifact=decision.artifact,
                truncated=body.truncated,
                cached=True,
            )
        if isinstance(decision, ChangeArguments):
            checked = tool.validate(decision.arguments)
            call = call.model_copy(update={"arguments": decision.arguments})
            if isinstance(checked, InvalidArguments):
                problems = [*checked.problems, f"(arguments set by the before_tool hook {hook_name(hook)!r})"]
                text = f"Invalid arguments for tool {call.name!r}:\n" + "\n".join(f"- {p}" for p in problems)
                return refused(
                    call,
                    run_id,
                    "invalid_arguments",
                    text,
                    {"problems": checked.problems, "hook": hook_name(hook)},
                )
    return call


async def run_after(
    hooks: list[AfterHook],
    call: HookCall,
    result: ToolResult,
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
) -> ToolResult:
    """Run the hooks in order on one result; each sees the previous one's replacement.

    A hook that raises (or returns something else than a ToolResult for the same call) withholds
    the result from the model, fail-closed, since hooks often redact: the model sees a ``blocked``
    result naming the hook, and the original is kept in ``artifact["withheld"]``, never lost.
    """
    for hook in hooks:
        try:
            out = await _call(hook, call, result)
            if out is None:
                continue
            if not isinstance(out, ToolResult) or (out.call_id, out.name) != (result.call_id, result.name):
                raise TypeError("an after_tool hook returns None or a ToolResult of the same call")
            result = out
        except Exception as exc:
            log.exception(
                "after_tool hook %s raised on call %s/%s", hook_name(hook), call.run_id, call.call_id
            )
            result = result.model_copy(
                update={
                    "status": "blocked",
                    "content": f"The result of tool {call.tool_name!r} is withheld: the after_tool hook "
                    f"{hook_name(hook)!r} failed ({type(exc).__name__}).",
                    "artifact": {
                        "withheld": result.model_dump(mode="json"),
                        "hook_error": _failure(hook, exc),
                    },
                    "truncated": False,
                }
            )
    if len(result.content) > max_result_chars:  # a replacement is held to the same limit
        body = cut(result.content, max_result_chars)
        result = result.model_copy(update={"content": body.text, "truncated": True})
    return result


# -- the ready-made cache ---------------------------------------------------------------------------


def arguments_digest(arguments: Any, scope: str | None = None) -> str:
    """A digest of the canonical JSON of a call's arguments (sorted keys) and of its scope: equal
    arguments in one scope, one entry; the same arguments in two scopes (two users), two."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if scope is not None:
        canonical = f"{len(scope)}:{scope}:{canonical}"
    return hashlib.sha256(canonical.encode()).hexdigest()


class ResultCache:
    """Answers calls of read-only tools from earlier ``ok`` results of the same scope, for ``ttl_secs``.

    Give both hooks to the dispatcher: ``before_tool=[cache.before], after_tool=[cache.after]``.
    Entries live in Redis (the dispatcher's, unless ``settings`` says otherwise), or in this
    process's memory for the embedded engine. Tools that are not read-only are never cached.
    """

    def __init__(self, ttl_secs: float, *, settings: Settings | None = None) -> None:
        if not ttl_secs > 0:
            raise ValueError(f"ttl_secs must be > 0, not {ttl_secs}")
        self.ttl_secs = ttl_secs
        self._settings = settings
        self._lock = threading.Lock()
        self._entries: CacheStore | None = None

    def bind(self, settings: Settings) -> None:
        """Use a dispatcher's settings, unless this cache was given its own or is already in use."""
        with self._lock:
            if self._settings is None and self._entries is None:
                self._settings = settings

    def _store(self) -> CacheStore:
        with self._lock:
            if self._entries is None:
                self._entries = make_cache_store(self._settings or Settings.from_env())
            return self._entries

    def before(self, call: HookCall) -> Answer | None:
        """A ``before_tool`` hook: the stored result of the same read-only call, if any."""
        if call.tool is None or not call.tool.read_only:
            return None
        digest = arguments_digest(call.arguments, call.scope)
        raw = self._store().get(call.tool.name, call.tool.schema_hash, digest)
        if raw is None:
            return None
        stored = ToolResult.model_validate_json(raw)
        return Answer(stored.content, stored.artifact)

    def after(self, call: HookCall, result: ToolResult) -> None:
        """An ``after_tool`` hook: store ``ok`` results of read-only tools that really ran."""
        if call.tool is None or not call.tool.read_only or result.status != "ok" or result.cached:
            return
        self._store().put(
            call.tool.name,
            call.tool.schema_hash,
            arguments_digest(call.arguments, call.scope),
            result.model_dump_json(),
            self.ttl_secs,
        )
