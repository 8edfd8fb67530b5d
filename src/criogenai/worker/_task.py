"""The one Celery task: decode the message and hand the call to the runner (``runner._call``).

This module only joins the runner to Celery: the runner's steps become Celery's return value,
``retry``, ``Ignore`` and ``Reject``; Celery's soft limit interrupts a run; and the main process's
reports of a child that died or was killed at its hard limit reach the runner.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import socket
from typing import Any

from billiard.common import terminate_handler_fired
from billiard.exceptions import WorkerLostError
from celery import Celery, Task, signals
from celery.app.task import get_actual_ignore_result
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded
from celery.worker import state as worker_state
from celery.worker.request import Request
from pydantic import ValidationError

from .._errors import CallFailed
from .._keys import TASK_NAME, task_id
from .._message import SENT_AT_HEADER, hard_limit_secs, send_call, shown_options
from .._wire import FAILED_STATUSES, ToolResult, ToolTask
from ..runner import Answered, CallRunner, Delivery, NotRun, Refused, RunAgain, StoreAway
from ..runner._outcomes import CallReport
from ..store import Ledger
from ..tools import ToolRegistry
from ._credentials import stop_if_refused
from ._heartbeat import BeatHook, Heartbeat
from ._soft_limit import soft_limit_only_in_call
from ._transport import acked_with_result

log = logging.getLogger(__name__)


_Returned = dict[str, Any] | CallReport


def _for_celery(result: ToolResult, task: Task) -> _Returned:
    """What the task returns, or raises for a failed call (``CallFailed``: Celery's FAILURE state,
    its task-failed event, Flower's "failed", with no error text). Celery stores it unless results
    are ignored (the ledger writes Celery's record itself; a message may say otherwise): then the
    result without its artifact, which may hold what ``return_generic`` hides. Otherwise a small
    report, for Celery's log line. The full result is in the ledger."""
    if result.status in FAILED_STATUSES:
        raise CallFailed(result.status, result.name, result.run_id or "", result.call_id)
    if not get_actual_ignore_result(task, task.request):
        return result.model_dump(mode="json", exclude={"artifact"})
    return CallReport(result.status, result.attempts, result.duration_secs or 0.0)


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
    """A worker process's call runner, adapted to Celery: its steps become Celery's return,
    ``retry``, ``Ignore`` and ``Reject``; its identity and the catalog publisher live here."""

    def __init__(
        self, app: Celery, registry: ToolRegistry, ledger: Ledger, *, signing_secret: str | None = None
    ) -> None:
        self.app = app
        self.runner = CallRunner(
            registry,
            ledger,
            host=socket.gethostname(),
            signing_secret=signing_secret,
            interrupts=(SoftTimeLimitExceeded,),
            refused=stop_if_refused,
            # Celery ends a prefork child under a running call (a lost broker connection, a
            # revoke with terminate): billiard's SIGTERM handler raises SystemExit in the tool,
            # which is the process leaving, not the tool failing; the call is then redelivered.
            exiting=terminate_handler_fired,
        )
        self.on_heartbeat: BeatHook | None = None  # the tool catalog's publisher (``_catalog``)

    @property
    def ledger(self) -> Ledger:
        return self.runner.ledger

    def after_fork(self) -> None:
        self.runner.after_fork()

    def run(self, task: Task, body: Any) -> _Returned:
        payload = _payload(task, body)
        # On the threads and solo pools the message is acknowledged with the result, and kombu's
        # own ack is then skipped; a prefork child cannot tell its parent, so there kombu acks.
        tag = None if self.runner.inline_sync else (task.request.properties or {}).get("delivery_tag")
        sent_at = task.request.get(SENT_AT_HEADER)
        delivery = Delivery(
            payload,
            refusal=_celery_refusal(task, payload, signed=self.runner.signing_secret is not None),
            misaddressed=_foreign_id(task, payload),
            delivery_id=task.request.id,
            delivery_tag=tag,
            sent_at=sent_at if isinstance(sent_at, int | float) else None,
        )
        try:
            with soft_limit_only_in_call() if self.runner.inline_sync else contextlib.nullcontext():
                step = self.runner.run(delivery)
        except StoreAway as away:
            # The claim: the message goes back on the queue (nothing ran, nothing is held) and is
            # taken again in a moment. The filing: given up; the lease runs out and the
            # dispatcher sends the call again.
            raise Reject(str(away), requeue=True) if away.stage == "claim" else Ignore() from None
        if isinstance(step, Answered):
            if tag is not None and self.ledger.broker_acks:
                acked_with_result(tag)
            return _for_celery(step.result, task)
        if isinstance(step, Refused):
            raise Reject(f"refused: {step.why}", requeue=False)
        if isinstance(step, RunAgain):
            raise task.retry(countdown=step.delay, max_retries=None, **shown_options(step.payload))
        assert isinstance(step, NotRun)
        raise Ignore()  # its dispatcher answers for it

    def on_process_failure(self, body: Any, *, hard_limit: bool) -> None:
        """In the main process: a call's process died (worker lost) or was killed at its hard limit."""

        def send_again(payload: ToolTask, queue: str, countdown: float | None) -> None:
            send_call(self.app, payload, queue, countdown=countdown)

        self.runner.process_lost(body, hard_limit=hard_limit, send_again=send_again)


def _celery_refusal(task: Task, payload: ToolTask, *, signed: bool) -> str | None:
    """Why a message must not run that only Celery can carry: follow-up tasks, or time limits
    other than the signed call's."""
    request = task.request
    if any(getattr(request, name, None) for name in ("callbacks", "errbacks", "chain", "chord")):
        return "the message asks for follow-up tasks, which criogenai never sends"
    if signed:
        limits = tuple(getattr(request, "timelimit", None) or (None, None))
        wanted = (hard_limit_secs(payload.timeout_secs), payload.timeout_secs)
        if len(limits) != 2 or any(
            not isinstance(got, int | float) or abs(got - want) > 1e-6
            for got, want in zip(limits, wanted, strict=False)
        ):
            return "the message's time limits are not the signed call's"
    return None


def _foreign_id(task: Task, payload: ToolTask) -> str | None:
    """Plain Celery (send_task, a group) with an id of its own: results would be filed, and
    Celery's record written, under the call's own id, which the sender would never read."""
    expected_id = task_id(payload.run_id, payload.call.id)
    if task.request.id == expected_id:
        return None
    return (f"its task id is not the call's own, criogenai.task_id(run_id, call_id) = "
            f"{expected_id!r}: send it with that task_id")


class CallRequest(Request):  # type: ignore[misc]
    """Celery's request for a call. Described in control replies (``inspect active``, ``reserved``,
    ``scheduled``, ``query_task``) as in logs and Flower: shadow name and ids, never the
    arguments, which Celery's own CLI asks for (``safe=False``). In the main process it tells the
    runtime when the call's process died or was killed at its hard limit; not during a cold
    shutdown, when the call is left to its lease and its dispatcher sends it again."""

    runtime: WorkerRuntime

    def info(self, safe: bool = False) -> dict[str, Any]:
        return super().info(safe=True)  # type: ignore[no-any-return]

    def cancel(self, pool: Any, signal: Any = None, emit_retry: bool = True) -> None:
        # Celery cancels a running call when the broker connection drops, and would then write a
        # RETRY record to the result backend, which is that same Redis, away: a traceback per
        # call in every outage. The ledger, not Celery's record, says what becomes of the call.
        super().cancel(pool, signal, emit_retry=False)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if not soft and not worker_state.should_terminate:
            self.runtime.on_process_failure(self._call_body(), hard_limit=True)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
        exc = getattr(exc_info.exception, "exc", exc_info.exception)  # ExceptionWithTraceback
        stopped = getattr(self, "_already_cancelled", False) or getattr(self, "_already_revoked", False)
        # billiard reports a child that exited (SystemExit) as Celery then does: a lost worker
        lost = isinstance(exc, WorkerLostError) or (isinstance(exc, SystemExit | KeyboardInterrupt)
                                                    and not stopped)
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        if lost and not worker_state.should_terminate:
            self.runtime.on_process_failure(self._call_body(), hard_limit=False)

    def _call_body(self) -> Any:
        kwargs = self.kwargs
        return kwargs.get("task") if isinstance(kwargs, dict) else None


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
        Request=type("CallRequest", (CallRequest,), {"runtime": runtime}),
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
