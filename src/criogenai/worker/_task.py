"""The one Celery task: decode the call, claim it, execute it, retry or file the result.

Outcomes live in ``runner``; the claim and the filing in ``store._ledger``. This module only joins
them to Celery: its retry machinery, its soft limit and its worker-lost and hard-timeout reports.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import time
import uuid
from typing import Any, NoReturn

from billiard.exceptions import WorkerLostError
from celery import Celery, Task, signals
from celery.app.task import get_actual_ignore_result
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded, TimeLimitExceeded
from celery.worker.request import Request
from pydantic import ValidationError

from .._errors import CallFailed, StoreUnavailable
from .._keys import TASK_NAME, task_id
from .._loop import pause
from .._message import hard_limit_secs, send_call, shown_options
from .._refusals import ErrorBurst
from .._signing import authentic, refusal, sign_result
from .._tracing import end_tool_span, tool_span
from .._wire import FAILED_STATUSES, ToolResult, ToolTask
from ..runner import _executor
from ..runner._outcomes import (
    CallReport,
    Outcome,
    call_result,
    cancelled_before_start,
    filed_result,
    refused_result,
    retry_delay,
    timed_out,
    too_many_runs,
    unknown_tool_result,
)
from ..store import Claim, Ledger
from ..tools import ToolContext, ToolRegistry
from ._credentials import stop_if_refused
from ._leases import BeatHook, Heartbeat, LeaseKeeper
from ._transport import acked_with_result

log = logging.getLogger(__name__)
_store_errors = ErrorBurst(log, "the ledger (Redis) did not answer a claim or a filing")

FILE_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0, None)
"""Waits between tries to file a finished call's result while Redis is away (about 15 s, plus the
ledger's own quick retries each time); then the call is left to its lease and sent again."""


_Returned = dict[str, Any] | CallReport


def _for_celery(result: ToolResult, task: Task) -> _Returned:
    """What the task returns, or raises for a failed call (``CallFailed``: Celery's FAILURE state,
    its task-failed event, Flower's "failed", with no error text). Read by the log and metrics
    hooks (``task_postrun``), and stored by Celery unless results are ignored (the ledger writes
    Celery's record itself; a message may say otherwise): then the result without its artifact,
    which may hold what ``return_generic`` hides. The full result is in the ledger."""
    report = CallReport(result.status, result.attempts, result.duration_secs or 0.0)
    if result.status in FAILED_STATUSES:
        failed = CallFailed(result.status, result.name, result.run_id or "", result.call_id)
        failed.report = report
        raise failed
    if not get_actual_ignore_result(task, task.request):
        return result.model_dump(mode="json", exclude={"artifact"})
    return report


def _payload(task: Task, body: Any) -> ToolTask:
    """The call a message carries; a message that is not one is rejected, naming where and what
    is wrong but never the input (a refused message's arguments may hold secrets)."""
    try:
        return ToolTask.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
            for e in exc.errors(include_input=False)[:10]
        )
        log.error("refused task %s: not a criogenai call: %s", task.request.id, problems)
        raise Reject(f"not a criogenai call (v1): {exc.error_count()} problem(s)", requeue=False) from None


class WorkerRuntime:
    """What a worker process needs to run calls: its tools, the ledger and its identity."""

    def __init__(
        self, app: Celery, registry: ToolRegistry, ledger: Ledger, *, signing_secret: str | None = None
    ) -> None:
        self.app = app
        self.registry = registry
        self.ledger = ledger
        self.signing_secret = signing_secret
        """With a secret, only calls signed with it run (``_signing``); without, signatures are ignored."""
        self.leases = LeaseKeeper(ledger)
        self.on_heartbeat: BeatHook | None = None  # the tool catalog's publisher (``_catalog``)
        self.inline_sync = False
        self.token = self._new_token()

    @staticmethod
    def _new_token() -> str:
        return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def after_fork(self) -> None:
        """In a prefork child: own token and threads; sync tools run inline under Celery's limits."""
        self.token = self._new_token()
        self.inline_sync = True
        self.leases.reset_after_fork()
        _executor.reset_after_fork()

    def run(self, task: Task, body: Any) -> _Returned:
        payload = _payload(task, body)
        call, run_id = payload.call, payload.run_id
        why = self._refusal(task, payload)
        if why is not None:
            self._refuse(task, payload, why)
        tool = self.registry.get(call.name)
        if tool is None:
            # A forged name, or a tool this worker does not have: nothing is imported or run.
            log.error("refused call %s/%s (task %s): unknown tool %r", run_id, call.id, task.request.id,
                      call.name[:100])
            result = unknown_tool_result(payload, self.registry)
            # A token no claim holds: a forged message must not drop a running call's claim.
            self._file(result, run_id, "refused", payload.reply_to, done=True)
            return _for_celery(result, task)
        expected_id = task_id(run_id, call.id)
        if task.request.id != expected_id:
            # Plain Celery (send_task, a group) with an id of its own: results are filed, and
            # Celery's record written, under the call's own id, which the sender would never read.
            self._refuse(task, payload, "its task id is not the call's own, criogenai.task_id(run_id, "
                         f"call_id) = {expected_id!r}: send it with that task_id")
        if payload.max_attempts > 1 and not tool.retryable:
            # The rule is the worker's too: a queue written by others cannot make it retry a
            # tool that is neither read-only nor idempotent.
            payload = payload.model_copy(update={"max_attempts": 1})

        claim = self._claim(payload)
        if claim.kind == "expired":
            # Never started and past its deadline, given up, or failed the turn: the dispatcher
            # has already answered for it, so no result is filed. A replayed old message ends here.
            log.warning("call %s/%s not run: its deadline passed before it started, or its "
                        "dispatcher gave up on it", run_id, call.id)
            raise Ignore()
        if claim.kind == "cancelled":
            # Its turn was cancelled before this run could start (a first run or a retry).
            log.info("call %s/%s not run: its turn was cancelled", run_id, call.id)
            starts = self.ledger.progress(run_id, [call.id])[call.id].starts
            return self._finish(payload, cancelled_before_start(call.name), starts, task)
        if claim.kind != "claimed":
            log.info("call %s/%s not run: %s", run_id, call.id, claim.kind)
            raise Ignore()
        attempt = claim.attempt
        lost = too_many_runs(payload, attempt)
        if lost is not None:
            return self._finish(payload, lost, attempt, task)

        stop = _executor.CallStop()
        ctx = ToolContext(
            call_id=call.id,
            run_id=run_id,
            tool_name=call.name,
            attempt=attempt,
            scope=payload.scope,
            cancel_event=stop.event,
        )
        self.leases.hold(run_id, call.id, self.token, on_cancel=stop.cancel)
        started = time.monotonic()
        with tool_span(call.name, call.id, run_id, attempt) as span:
            try:
                outcome = _executor.execute(
                    tool,
                    call.arguments,
                    ctx,
                    timeout_secs=payload.timeout_secs,
                    on_tool_exception=payload.on_tool_exception,
                    max_result_chars=payload.max_result_chars,
                    max_stored_chars=payload.max_stored_chars,
                    inline_sync=self.inline_sync,
                    interrupts=(SoftTimeLimitExceeded,),
                    stop=stop,
                )
            except SoftTimeLimitExceeded:  # landed in the executor's own code, after the tool's run
                outcome = timed_out(call.name, payload.timeout_secs, time.monotonic() - started)
            except BaseException:
                self.leases.drop(run_id, call.id)
                raise
            end_tool_span(span, outcome.status, outcome.artifact)
        try:
            return self._conclude(task, payload, outcome, attempt)
        except SoftTimeLimitExceeded:
            # Celery's soft limit and the executor's own timer both fire at timeout_secs, and the
            # signal may land after the tool's run has ended (an async tool, timed by the
            # executor): the outcome stands. Concluding again is safe (filing a result is
            # idempotent) and billiard sends the signal once per task.
            return self._conclude(task, payload, outcome, attempt)

    def _conclude(self, task: Task, payload: ToolTask, outcome: Outcome, attempt: int) -> _Returned:
        """Log the run, then retry it later or file its result."""
        call, run_id = payload.call, payload.run_id
        log.info(
            "call %s/%s tool=%s attempt=%d status=%s duration=%.3fs",
            run_id,
            call.id,
            call.name,
            attempt,
            outcome.status,
            outcome.duration_secs,
        )
        delay = retry_delay(payload, outcome, attempt)
        if delay is not None:
            self.leases.drop(run_id, call.id)  # idempotent: run again if a late soft limit cut it short
            self.ledger.await_retry(run_id, call.id, self.token, delay)
            raise task.retry(countdown=delay, max_retries=None, **shown_options(payload))
        return self._finish(payload, outcome, attempt, task)

    def _refusal(self, task: Task, payload: ToolTask) -> str | None:
        """Why this message must not run, before any claim or code: its signature, or Celery
        options that criogenai never sends (follow-up tasks, time limits other than the call's)."""
        why = refusal(payload, self.signing_secret)
        if why is not None:
            return why
        request = task.request
        if any(getattr(request, name, None) for name in ("callbacks", "errbacks", "chain", "chord")):
            return "the message asks for follow-up tasks, which criogenai never sends"
        if self.signing_secret is not None:
            limits = tuple(getattr(request, "timelimit", None) or (None, None))
            wanted = (hard_limit_secs(payload.timeout_secs), payload.timeout_secs)
            if len(limits) != 2 or any(
                not isinstance(got, int | float) or abs(got - want) > 1e-6
                for got, want in zip(limits, wanted, strict=False)
            ):
                return "the message's time limits are not the signed call's"
        return None

    def _refuse(self, task: Task, payload: ToolTask, why: str) -> NoReturn:
        """Reject the message: Celery sends no follow-up task and stores nothing for it.

        Without a signing secret, first file a refusal the dispatcher can show (the call never ran).
        With one, nothing is filed: only a message that fails the checks gets here, so its
        reply list, ids and tool name are anyone's (an unsigned copy of a running call's
        message would end the real call's turn with a refusal naming what the sender chose), and
        a dispatcher with the right secret never sends one. A dispatcher without it learns from
        the catalog (``_catalog``) instead.
        """
        call = payload.call
        log.error("refused call %s/%s (task %s, tool %r): %s; nothing ran",
                  payload.run_id[:100], call.id[:100], task.request.id, call.name[:100], why)
        if self.signing_secret is None:
            # Not filed as finished (done=False), so that running the turn again can still run the
            # call; a token no claim holds, so that a forged message cannot drop a running call's claim.
            self._file(refused_result(payload, why), payload.run_id, "refused", payload.reply_to, done=False)
        raise Reject(f"refused: {why}", requeue=False)

    def _file(
        self,
        result: ToolResult,
        run_id: str,
        token: str | None,
        reply_to: str | None,
        *,
        done: bool,
        delivery_tag: str | None = None,
    ) -> None:
        """``Ledger.finish``, with the result signed when this worker has a signing secret."""
        if self.signing_secret is None:
            self.ledger.finish(result, run_id, token, reply_to, done=done, delivery_tag=delivery_tag)
            return
        result = sign_result(result, self.signing_secret)
        filed = self.ledger.finish(result, run_id, token, reply_to, done=done, delivery_tag=delivery_tag)
        if not filed and self._evicted_forgery(run_id, result.call_id):
            self.ledger.finish(result, run_id, token, reply_to, done=done)  # acknowledged above

    def _claim(self, payload: ToolTask) -> Claim:
        """The ledger's claim of the call; a forged result filed for it does not count as done.
        When Redis does not answer, the message goes back on the queue: nothing ran, nothing is
        held, and it is taken again in a moment (the ledger's own retries waited a few seconds)."""
        run_id, call_id = payload.run_id, payload.call.id
        try:
            claim = self.ledger.claim(run_id, call_id, self.token, payload.deadline)
            if claim.kind == "done" and self._evicted_forgery(run_id, call_id):
                claim = self.ledger.claim(run_id, call_id, self.token, payload.deadline)
        except StoreUnavailable as exc:
            if not stop_if_refused(exc):
                _store_errors.failed(exc)
            raise Reject("the ledger did not answer the claim", requeue=True) from None
        _store_errors.ok()
        return claim

    def _evicted_forgery(self, run_id: str, call_id: str) -> bool:
        """With a signing secret: when the result filed for the call is not one a worker signed
        (anyone can write the results hash), remove it, so that it neither keeps the call from
        running nor its real result from being filed; say whether it did. A genuine result stays."""
        if self.signing_secret is None:
            return False
        filed = self.ledger.finished(run_id, [call_id]).get(call_id)
        if filed is not None and authentic(filed, self.signing_secret, run_id, call_id):
            return False
        log.warning("call %s/%s: removed a filed result without a valid signature", run_id, call_id)
        self.ledger.evict(run_id, call_id)
        return True

    def _finish(
        self, payload: ToolTask, outcome: Outcome, attempts: int, task: Task
    ) -> _Returned:
        result, done = filed_result(payload, outcome, attempts)
        # On the threads and solo pools the message is acknowledged with the result, and kombu's
        # own ack is then skipped; a prefork child cannot tell its parent, so there kombu acks.
        tag = None if self.inline_sync else (task.request.properties or {}).get("delivery_tag")
        for delay in FILE_RETRY_DELAYS:
            try:
                self._file(result, payload.run_id, self.token, payload.reply_to, done=done, delivery_tag=tag)
                _store_errors.ok()
                break
            except StoreUnavailable as exc:
                # The call ran: keep its result and its lease (still renewed) while the store is
                # away, rather than have it run again elsewhere.
                if not stop_if_refused(exc):
                    _store_errors.failed(exc)
                if delay is None:
                    # Given up: the lease runs out and the dispatcher sends the call again.
                    self.leases.drop(payload.run_id, payload.call.id)
                    raise Ignore() from None
                pause(delay)
        self.leases.drop(payload.run_id, payload.call.id)
        if tag is not None and self.ledger.broker_acks:
            acked_with_result(tag)
        return _for_celery(result, task)

    def on_process_failure(self, exc: BaseException, kwargs: dict[str, Any] | None) -> None:
        """In the main process: a call's process died (worker lost) or was killed at its hard limit."""
        try:
            payload = ToolTask.model_validate((kwargs or {}).get("task"))
        except ValidationError:
            return
        tool = self.registry.get(payload.call.name)
        if isinstance(exc, TimeLimitExceeded):
            outcome = timed_out(payload.call.name, payload.timeout_secs, payload.timeout_secs, stopped=True)
            starts = self.ledger.progress(payload.run_id, [payload.call.id])[payload.call.id].starts
            delay = retry_delay(payload, outcome, starts) if tool is not None and tool.retryable else None
            if tool is not None and delay is not None:
                # Killed at its hard limit (it caught or outlived the soft one): a timeout like any
                # other, so a read-only or idempotent tool is run again, as the rule says.
                log.warning("call %s/%s was killed at its hard limit (run %d): running it again in %.1f s",
                            payload.run_id, payload.call.id, starts, delay)
                self.ledger.release(payload.run_id, payload.call.id)
                send_call(self.app, payload, tool.queue, countdown=delay)
                return
            result = call_result(payload, outcome, starts)
            self._file(result, payload.run_id, None, payload.reply_to, done=True)
        elif tool is not None:
            # The run is over; run the call again (at least once), bounded by the claim's count.
            log.warning(
                "call %s/%s lost its process (%s): sending it again",
                payload.run_id,
                payload.call.id,
                type(exc).__name__,
            )
            self.ledger.release(payload.run_id, payload.call.id)
            send_call(self.app, payload, tool.queue)


class CallRequest(Request):  # type: ignore[misc]
    """Celery's request for a call, described in control replies (``inspect active``, ``reserved``,
    ``scheduled``, ``query_task``) as in logs and Flower: shadow name and ids, never the
    arguments, which Celery's own CLI asks for (``safe=False``)."""

    def info(self, safe: bool = False) -> dict[str, Any]:
        return super().info(safe=True)  # type: ignore[no-any-return]


def register(app: Celery, runtime: WorkerRuntime) -> None:
    """Register the task and the signal handlers that connect Celery to the runtime."""

    # shared=False: a task shared across apps would make a second app in this process (a second
    # worker app with other tools) run the first app's tools.
    # Celery's result records only when the settings ask for them; when the ledger writes them
    # itself (in the step that files the result), Celery's own store would only write them again,
    # at two more round trips.
    records = runtime.ledger.celery_records

    @app.task(  # type: ignore[untyped-decorator]
        name=TASK_NAME,
        bind=True,
        shared=False,
        acks_late=True,
        reject_on_worker_lost=False,
        Request=CallRequest,
        ignore_result=runtime.ledger.stores_celery_results or not records,
        store_errors_even_if_ignored=records,  # with records, a refused message keeps its FAILURE
        throws=(CallFailed,),  # an expected end: logged in a line, without a traceback
    )
    def call(self: Task, task: Any = None) -> _Returned:
        return runtime.run(self, task)

    heartbeats: list[Heartbeat] = []

    @signals.worker_ready.connect(weak=False)  # type: ignore[untyped-decorator]
    def _ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        queues = sorted(q.name for q in sender.task_consumer.queues)
        beat = Heartbeat(runtime.ledger, str(sender.hostname), queues, also=runtime.on_heartbeat,
                         interval=runtime.ledger.heartbeat_ttl_secs / 5)
        beat.start()
        heartbeats.append(beat)
        # What is loaded now lives as long as the worker: keep the collector from scanning it
        # again and again.
        gc.freeze()

    @signals.worker_shutdown.connect(weak=False)  # type: ignore[untyped-decorator]
    def _shutdown(**_: Any) -> None:
        while heartbeats:
            heartbeats.pop().stop()

    @signals.worker_process_init.connect(weak=False)  # type: ignore[untyped-decorator]
    def _child_started(**_: Any) -> None:
        runtime.after_fork()
        gc.freeze()  # as in _ready: a pool child is forked before the worker is ready

    @signals.task_failure.connect(weak=False)  # type: ignore[untyped-decorator]
    def _failed(
        sender: Any = None, exception: BaseException | None = None, kwargs: Any = None, **_: Any
    ) -> None:
        if getattr(sender, "name", None) != TASK_NAME or getattr(sender, "app", None) is not app:
            return
        if isinstance(exception, WorkerLostError | TimeLimitExceeded):
            runtime.on_process_failure(exception, kwargs)
