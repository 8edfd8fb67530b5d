"""Dispatcher: validates a turn's calls, fans the valid ones out as Celery tasks, gathers results."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._config import Limits, Retry, Settings, parse_rate
from .._errors import ConfigurationError, RemoteToolException, ToolFailed
from .._loop import refuse_on_a_running_loop, run_sync
from .._message import hard_limit_secs
from .._signing import sign
from .._tracing import note_turn, traced_turn
from .._wire import OnToolException, ToolCall, ToolResult, ToolTask
from ..runner import abandoned_threads
from ..store import Gate, Ledger, make_ledger
from ..tools import MCPServer, Tool, ToolRegistry
from ._admission import Send
from ._approvals import Approvals
from ._checkpoint import Checkpoint
from ._hooks import AfterHook, BeforeHook
from ._inprocess import InProcessEngine
from ._seam import Engine, Gathered
from ._validate import ValidCall, check_turn, coerce_calls

CallLike = ToolCall | Mapping[str, Any]


def _causes(gathered: dict[str, ToolResult]) -> dict[str, BaseException]:
    return gathered.causes if isinstance(gathered, Gathered) else {}


def check_scope(scope: str | None) -> str | None:
    """A scope is 1-200 printable characters without braces (it names Redis keys), or None."""
    if scope is None:
        return None
    if not isinstance(scope, str) or not 0 < len(scope) <= 200 or not scope.isprintable() or "{" in scope \
            or "}" in scope:
        raise ConfigurationError(f"scope {scope!r}: use 1 to 200 printable characters, without braces")
    return scope


def check_run_id(run_id: str) -> str:
    """A run id is 1-200 printable characters without braces: it names the run's Redis keys inside
    a hash tag (``crg:{<run>}:...``), where a brace would let one run's key be another's (run
    ``a}:claim:c`` has the results key of run ``a``'s call ``c}:results``), and it is logged."""
    if not isinstance(run_id, str) or not 0 < len(run_id) <= 200 or not run_id.isprintable() \
            or "{" in run_id or "}" in run_id:
        raise ConfigurationError(f"run id {run_id!r}: use 1 to 200 printable characters, without braces")
    return run_id


class Dispatcher:
    """Runs turns of tool calls on a Celery fleet (or, with no broker configured, in-process).

    ``run_turn`` returns one ToolResult per call, in the order of the calls. Calls are validated
    here first: ``unknown_tool`` and ``invalid_arguments`` never reach a worker.
    """

    def __init__(
        self,
        tools: Iterable[Tool[..., Any] | MCPServer] | ToolRegistry,
        *,
        tool_retry: Retry | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        on_tool_exception: OnToolException = "return_to_model",
        broker_url: str | None = None,
        result_backend: str | None = None,
        settings: Settings | None = None,
        approve: Iterable[str] = (),
        before_tool: Sequence[BeforeHook] = (),
        after_tool: Sequence[AfterHook] = (),
    ) -> None:
        if on_tool_exception not in ("return_to_model", "return_generic", "fail"):
            raise ConfigurationError(
                f"on_tool_exception must be 'return_to_model', 'return_generic' or 'fail', "
                f"not {on_tool_exception!r}"
            )
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.retry = tool_retry or Retry()
        self.limits = Limits.coerce(limits)
        self.on_tool_exception: OnToolException = on_tool_exception
        self.settings = settings or Settings.from_env(broker_url=broker_url, result_backend=result_backend)
        self._check_limits()
        self._checkpoint = Checkpoint(
            self.registry,
            self.settings,
            approve=approve,
            before_tool=before_tool,
            after_tool=after_tool,
            max_result_chars=self.limits.max_result_chars,
        )
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    def _check_limits(self) -> None:
        """A call must end well within the broker's visibility timeout, or it gets a twin."""
        for t in [None, *self.registry]:
            timeout = t.timeout_secs if t and t.timeout_secs else self.limits.tool_timeout_secs
            worst = hard_limit_secs(timeout) + self.retry.max_backoff + 60
            if worst >= self.settings.visibility_timeout_secs:
                name = f"tool {t.name!r}" if t else "tool_timeout_secs"
                raise ConfigurationError(
                    f"{name}: a {timeout:g} s limit needs visibility_timeout_secs above {worst:g}"
                )

    # -- the engine, started on first use ---------------------------------------------------------

    def _start(self) -> Engine:
        with self._lock:
            if self._engine is None:
                ledger: Ledger = make_ledger(self.settings)
                if self.settings.embedded:  # no broker: the calls run in this process
                    self._engine = InProcessEngine(
                        self.registry,
                        ledger,
                        self.limits,
                        prefix=self.settings.key_prefix,
                        signing_secret=self.settings.signing_secret,
                    )
                else:
                    # the fleet engine (Celery, kombu) is imported only with a broker configured
                    from ._engine import fleet_engine

                    self._engine = fleet_engine(self.settings, ledger, self.limits)
            return self._engine

    def close(self) -> None:
        """Stop the dispatcher's threads (the embedded engine's too). Idempotent."""
        with self._lock:
            if self._engine is not None:
                self._engine.close()
                self._engine = None

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- turns ------------------------------------------------------------------------------------

    @traced_turn
    async def run_turn(
        self,
        calls: Sequence[CallLike],
        *,
        run_id: str | None = None,
        tenant: str | None = None,
        scope: str | None = None,
    ) -> list[ToolResult]:
        """Run one turn's calls concurrently on the fleet; one result per call, in order.

        Passing the ``run_id`` of an earlier attempt returns its finished calls' stored results
        without running them again; that is also how a turn resumes after approvals were decided.
        ``tenant`` counts the calls against ``Limits.tenant_concurrency``. ``scope`` (a user, tenant or
        namespace) travels with each call, signed, as ``ToolContext.scope``: memory is kept per scope.
        Cancelling the task that
        awaits this cancels the turn (``cancel``). Raises ``ToolFailed`` under ``on_tool_exception="fail"``.
        """
        scope = check_scope(scope)
        ordered, rid, valid, done = self._prepare(calls, run_id)
        ledger = self._start().ledger if run_id else None
        turn = await self._checkpoint.before(rid, valid, done, ledger, scope)
        sends = self._sends(turn.valid, rid, tenant, scope)
        future = self._start().submit(
            rid, sends, check_finished=run_id is not None, loop=asyncio.get_running_loop()
        )
        try:
            gathered = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # Off the event loop: cancelling does a few Redis round trips.
            threading.Thread(target=self.cancel, args=(rid,), name="criogenai-cancel", daemon=True).start()
            raise
        after = await self._checkpoint.after(turn, ordered, gathered | turn.done)
        return self._finish(ordered, {}, after, _causes(gathered))

    @traced_turn
    def run_turn_sync(
        self,
        calls: Sequence[CallLike],
        *,
        run_id: str | None = None,
        tenant: str | None = None,
        scope: str | None = None,
    ) -> list[ToolResult]:
        """``run_turn`` for code without an event loop. Called on a thread that runs one (an async
        tool, an ``async def`` handler), it would block that loop, which may be the very one the
        calls need: it raises instead (use ``await run_turn``)."""
        refuse_on_a_running_loop("run_turn_sync")
        scope = check_scope(scope)
        ordered, rid, valid, done = self._prepare(calls, run_id)
        ledger = self._start().ledger if run_id else None
        name, checkpoint = "run_turn_sync", self._checkpoint
        before = None if checkpoint.empty else checkpoint.before(rid, valid, done, ledger, scope)
        turn = None if before is None else run_sync(before, name)
        sends = self._sends(turn.valid if turn else valid, rid, tenant, scope)
        gathered = self._start().submit(rid, sends, check_finished=run_id is not None).result()
        if turn is None:
            return self._finish(ordered, done, gathered, _causes(gathered))
        after = run_sync(checkpoint.after(turn, ordered, gathered | turn.done), name)
        return self._finish(ordered, {}, after, _causes(gathered))

    def cancel(self, run_id: str) -> None:
        """Cancel a run's turn, from any process: calls not started never run, running ones are
        told to stop; each ends ``cancelled`` and the turn returns within seconds.

        Running the same run id again afterwards ends its unfinished calls ``cancelled`` too.
        """
        self._start().cancel(run_id)

    @property
    def abandoned_tool_threads(self) -> int:
        """This process's sync tool threads abandoned past their time limit (or at a cancel) whose
        tool has not returned yet: the embedded engine's, since a fleet runs tools on workers.
        Each holds a thread and its memory; the process warns as they pile up, never ends."""
        return abandoned_threads()

    @property
    def approvals(self) -> Approvals:
        """Decide this dispatcher's pending approvals in process (any process can: see ``Approvals``)."""
        return self._checkpoint.approvals

    def fetch_full(self, run_id: str, call_id: str) -> str:
        """The full text of a call's result, kept with its run beyond the cut the model read.

        LookupError when nothing is kept for it (see ``criogenai.fetch_full``).
        """
        from .._results import full_text

        # Both engines' runners sign what they file when there is a secret.
        return full_text(self._start().ledger, run_id, call_id, secret=self.settings.signing_secret)

    def _prepare(
        self, calls: Sequence[CallLike], run_id: str | None
    ) -> tuple[list[ToolCall], str, list[ValidCall], dict[str, ToolResult]]:
        ordered = coerce_calls(calls)
        rid = uuid.uuid4().hex if run_id is None else check_run_id(run_id)
        note_turn(rid, ordered, self.registry)
        valid, done = check_turn(ordered, self.registry, self.limits, rid)
        return ordered, rid, valid, done

    def _sends(
        self, valid: list[ValidCall], rid: str, tenant: str | None = None, scope: str | None = None
    ) -> list[Send]:
        engine = self._start()
        return [
            Send(
                self._task(v, rid, engine.reply_to, scope),
                v.tool.queue,
                v.tool.retryable,
                self._gates(v.tool, tenant),
            )
            for v in valid
        ]

    def _gates(self, tool: Tool[..., Any], tenant: str | None) -> tuple[Gate, ...]:
        """The fleet-wide limits a call of this tool takes a place in before it is published."""
        gates: list[Gate] = []
        caps = [n for n in (tool.max_concurrency, self.limits.tool_concurrency.get(tool.name)) if n]
        if caps:
            gates.append(Gate(f"tool:{tool.name}", min(caps)))
        tenant_cap = self.limits.tenant_limit(tenant)
        if tenant is not None and tenant_cap:
            gates.append(Gate(f"tenant:{tenant}", tenant_cap))
        tool_rate = self.limits.tool_rate.get(tool.name)
        if tool_rate:
            gates.append(Gate(f"rate:tool:{tool.name}", *parse_rate(tool_rate)))
        tenant_rate = self.limits.tenant_rate_of(tenant)
        if tenant is not None and tenant_rate:
            gates.append(Gate(f"rate:tenant:{tenant}", *parse_rate(tenant_rate)))
        return tuple(gates)

    def _task(self, v: ValidCall, run_id: str, reply_to: str, scope: str | None = None) -> ToolTask:
        """The call's message body, signed when the settings have a signing secret."""
        r = self.retry
        task = ToolTask(
            run_id=run_id,
            call=v.call,
            timeout_secs=v.tool.timeout_secs or self.limits.tool_timeout_secs,
            max_attempts=r.max_attempts if v.tool.retryable else 1,
            initial_backoff_secs=r.initial_backoff,
            max_backoff_secs=r.max_backoff,
            jitter=r.jitter,
            on_tool_exception=self.on_tool_exception,
            max_result_chars=self.limits.max_result_chars,
            reply_to=reply_to,
            deadline=time.time() + self.limits.queue_wait_secs,
            max_stored_chars=max(self.limits.max_stored_result_chars, self.limits.max_result_chars),
            scope=scope,
        )
        secret = self.settings.signing_secret
        return sign(task, secret) if secret else task

    def _finish(
        self,
        ordered: list[ToolCall],
        done: dict[str, ToolResult],
        gathered: dict[str, ToolResult],
        causes: dict[str, BaseException],
    ) -> list[ToolResult]:
        """The turn's results in order; under ``fail``, ``ToolFailed`` for the first exception,
        caused by the tool's own exception object where it was raised in this process (embedded)
        and by a ``RemoteToolException`` describing it where it was raised on a worker."""
        results = [done.get(c.id) or gathered[c.id] for c in ordered]
        if self.on_tool_exception == "fail":
            for r in results:
                if r.status == "exception":
                    info = (r.artifact or {}).get("exception")
                    info = info if isinstance(info, dict) else {}
                    type_name = str(info.get("type", "Exception"))
                    cause = causes.get(r.call_id) or RemoteToolException(
                        type_name, str(info.get("message", "")), str(info.get("traceback", ""))
                    )
                    raise ToolFailed(
                        f"tool {r.name!r} (call {r.call_id}) failed: {type_name}",
                        result=r,
                        results=results,
                    ) from cause
        return results


