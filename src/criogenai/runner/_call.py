"""One delivery of a call, run the same way by the worker's Celery task and the embedded engine.

The runner checks the message, claims the call, runs it (context, limits, cancel, span,
observers), decides on a retry and files the result, then answers with a step. An engine only
adapts the step to its own machinery; this table is every place where the two differ:

=============  ==========================================  ===========================================
step           worker (Celery task)                        embedded engine (it is its own dispatcher)
=============  ==========================================  ===========================================
``Answered``   return it (``CallFailed`` for a failure)    answer the turn with it
``Refused``    reject the message, no requeue              answer the turn with its result
``RunAgain``   ``task.retry(countdown=delay)``             a timer starts it again after ``delay``
``NotRun``     ``Ignore``: its dispatcher answers for it   ``done``: the filed result; ``busy``: look
                                                           again soon; ``expired``: ``not_started``
``StoreAway``  claim: requeue the message; filing:         claim: try again soon; filing: answer
               ``Ignore`` (the lease runs out, it is        ``lost``
               sent again)
abandoned      threads pool: at ``max_abandoned_threads``   the user's process is never ended: a
               (default max(16, 2 x concurrency)) one       WARNING at 16, then at each doubling;
               CRITICAL line, warm shutdown, exit 4 for     the count in
               the supervisor to restart it (prefork:       ``Dispatcher.abandoned_tool_threads``
               none, a child is killed at its hard limit)
=============  ==========================================  ===========================================

An abandoned thread is a sync tool's, given up on at its time limit or a cancel while it blocks in
C, where the exception raised into its thread cannot reach it (``_executor.on_abandoned``).
Besides: a prefork child runs sync tools on its own thread (``inline_sync``) under Celery's
limits (``interrupts``) and its parent reports a killed child (``process_lost``); a worker pushes
each result onto its dispatcher's reply list and acknowledges the message in the same step
(``replies``, ``Delivery.delivery_tag``), where the embedded engine answers its caller directly.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from .._errors import StoreUnavailable
from .._loop import pause
from .._refusals import ErrorBurst
from .._signing import authentic, refusal, sign_result
from .._tracing import end_tool_span, tool_span
from .._wire import ToolResult, ToolTask
from ..store import Claim, Ledger
from ..tools import Tool, ToolContext, ToolRegistry
from . import _executor
from ._leases import LeaseKeeper
from ._observe import Observers, call_fields
from ._outcomes import (
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

log = logging.getLogger(__name__)

FILE_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0, None)
"""Waits between tries to file a finished call's result while Redis is away (about 15 s, plus the
ledger's own quick retries each time); then ``StoreAway("filing")``."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a call to an engine: the call, and what the engine knows of its message."""

    payload: ToolTask
    refusal: str | None = None
    """The engine's own reason not to run the message, checked first (a worker: Celery options
    criogenai never sends)."""
    misaddressed: str | None = None
    """Why the message is not addressed as the call's own (a worker: a task id of its own), checked
    once its tool is known: a call of a tool nobody has is answered ``unknown_tool`` either way."""
    delivery_id: str | None = None
    """The message's id, for logs (a worker: the Celery task id)."""
    delivery_tag: str | None = None
    """The broker's tag of the message, acknowledged in the step that files the result."""
    sent_at: float | None = None
    """When the message was sent or its retry fell due (Unix time), for the queue-wait metric."""


@dataclass(frozen=True, slots=True)
class Answered:
    """The call ended on this delivery with ``result`` (filed, unless another run's came first);
    ``error`` is the exception the tool raised, for an engine that answers in this process."""

    result: ToolResult
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """The message must not run; nothing did. ``result`` is what its turn is told (filed only
    without a signing secret: with one, a refused message's ids and reply list are anyone's)."""

    why: str
    result: ToolResult


@dataclass(frozen=True, slots=True)
class RunAgain:
    """Run the call again after ``delay`` seconds (its claim waits for it); ``payload`` is the
    call as it runs again (a tool that may not be retried has one attempt, whatever was sent)."""

    delay: float
    payload: ToolTask


@dataclass(frozen=True, slots=True)
class NotRun:
    """This delivery did not run the call: it is ``done`` already, ``busy`` in another run, or
    ``expired`` (past its deadline before it started, given up, or it failed the turn)."""

    kind: Literal["done", "busy", "expired"]


Step = Answered | Refused | RunAgain | NotRun


class StoreAway(Exception):
    """The ledger did not answer the ``claim`` (nothing ran) or the ``filing`` (the call ran; its
    result is not kept, and its lease, no longer renewed, runs out)."""

    def __init__(self, stage: Literal["claim", "filing"]) -> None:
        super().__init__(f"the ledger did not answer the {stage}")
        self.stage = stage


Refusal = Callable[[BaseException], bool]
"""Says whether a store error is a refusal of credentials that was handled (a worker stops on it)."""


class CallRunner:
    """Runs deliveries of calls to the tools of one registry, claiming and filing in one ledger."""

    def __init__(
        self,
        registry: ToolRegistry,
        ledger: Ledger,
        *,
        host: str,
        signing_secret: str | None = None,
        replies: bool = True,
        interrupts: tuple[type[BaseException], ...] = (),
        refused: Refusal = lambda _: False,
        exiting: Callable[[], bool] = lambda: False,
    ) -> None:
        self.registry = registry
        self.ledger = ledger
        self.signing_secret = signing_secret
        """With a secret, only calls signed with it run, and results are signed; without, neither."""
        self.replies = replies
        self.interrupts = interrupts
        """Exceptions that mean the call's time is up, raised into it from outside (Celery's soft limit)."""
        self.exiting = exiting
        """Says the process is being ended under its calls (a prefork child's SIGTERM)."""
        self.inline_sync = False
        self.observers = Observers(passes=interrupts)
        self.leases = LeaseKeeper(ledger, refused)
        self._host = host
        self._refused = refused
        self._store_errors = ErrorBurst(log, "the ledger (Redis) did not answer a claim or a filing")
        self.token = self._new_token()
        """This process's part of the token each delivery claims and files under (``_delivery_token``)."""
        self._deliveries = itertools.count(1)

    def _new_token(self) -> str:
        return f"{self._host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def _delivery_token(self) -> str:
        """A token for one delivery's claim, lease and filing, never another's (two deliveries of
        a call in one process included): the ledger knows the delivery's own claim or filing,
        sent again after its reply was lost, from another delivery's (``Ledger.claim``)."""
        return f"{self.token}:{next(self._deliveries)}"

    def after_fork(self) -> None:
        """In a prefork child: its own token and threads; sync tools run inline under Celery's limits."""
        self.token = self._new_token()
        self.inline_sync = True
        self.leases.reset_after_fork()
        _executor.reset_after_fork()

    # -- a delivery ------------------------------------------------------------------------------

    def run(self, delivery: Delivery) -> Step:
        """Run one delivery of a call; raises ``StoreAway`` when the ledger does not answer."""
        with call_fields(delivery.payload, delivery.delivery_id):
            return self._run(delivery)

    def _run(self, d: Delivery) -> Step:
        payload = d.payload
        call, run_id = payload.call, payload.run_id
        why = refusal(payload, self.signing_secret) or d.refusal
        if why is not None:
            return self._refuse(payload, why, d.delivery_id)
        tool = self.registry.get(call.name)
        if tool is None:
            # A forged name, or a tool this worker does not have: nothing is imported or run.
            log.error("refused call %s/%s (%s): unknown tool %r", run_id[:100], call.id[:100],
                      d.delivery_id or "embedded", call.name[:100])
            result = unknown_tool_result(payload, self.registry)
            # A token no claim holds: a forged message must not drop a running call's claim. The
            # message is acknowledged in the same step, as with any filed result.
            self._file(result, payload, "refused", done=True, delivery_tag=d.delivery_tag)
            self.observers.call_ended(payload, result)
            return Answered(result)
        if d.misaddressed is not None:
            return self._refuse(payload, d.misaddressed, d.delivery_id)
        if payload.max_attempts > 1 and not tool.retryable:
            # The rule holds whoever wrote the message: a tool that is neither read-only nor
            # idempotent runs once.
            payload = payload.model_copy(update={"max_attempts": 1})

        token = self._delivery_token()
        claim = self._claim(payload, token)
        if claim.kind == "cancelled":
            # Its turn was cancelled before this run could start (a first run or a retry).
            log.info("call %s/%s not run: its turn was cancelled", run_id, call.id)
            starts = self.ledger.progress(run_id, [call.id])[call.id].starts
            return self._finish(d, payload, cancelled_before_start(call.name), starts, token)
        if claim.kind != "claimed":
            if claim.kind == "expired":
                # Never started and past its deadline, given up, or failed the turn: its
                # dispatcher has answered for it already. A replayed old message ends here.
                log.warning("call %s/%s not run: its deadline passed before it started, or its "
                            "dispatcher gave up on it", run_id, call.id)
            else:
                log.info("call %s/%s not run: %s", run_id, call.id, claim.kind)
            return NotRun(claim.kind)
        attempt = claim.attempt
        lost = too_many_runs(payload, attempt)
        if lost is not None:
            return self._finish(d, payload, lost, attempt, token)
        try:
            outcome = self._execute(d, payload, tool, attempt, token)
            try:
                return self._conclude(d, payload, outcome, attempt, token)
            except self.interrupts:
                # Celery's soft limit and the executor's own timer both fire at timeout_secs, and
                # the signal may land after the run has ended (an async tool, timed by the
                # executor): the outcome stands. Concluding again is safe (filing is
                # idempotent), and billiard sends the signal once per task.
                return self._conclude(d, payload, outcome, attempt, token)
        except BaseException:
            # Whatever ends this run (a store error other than an outage, the process leaving, a
            # bug), the claim it holds must not be renewed for ever: it would keep the call "busy".
            self.leases.drop(run_id, call.id)
            raise

    def _execute(
        self, d: Delivery, payload: ToolTask, tool: Tool[..., Any], attempt: int, token: str
    ) -> Outcome:
        """One run of the call, its claim renewed and a cancel of its turn reaching it."""
        call, run_id = payload.call, payload.run_id
        stop = _executor.CallStop()
        ctx = ToolContext(
            call_id=call.id,
            run_id=run_id,
            tool_name=call.name,
            attempt=attempt,
            scope=payload.scope,
            cancel_event=stop.event,
        )
        self.leases.hold(run_id, call.id, token, on_cancel=stop.cancel)
        queued = None if d.sent_at is None else max(0.0, time.time() - d.sent_at)
        self.observers.run_started(payload, attempt, queued)
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
                    interrupts=self.interrupts,
                    stop=stop,
                    exiting=self.exiting,
                )
            except self.interrupts:  # landed in the executor's own code, after the tool's run
                outcome = timed_out(call.name, payload.timeout_secs, time.monotonic() - started)
            end_tool_span(span, outcome.status, outcome.artifact)
        return outcome

    def _conclude(self, d: Delivery, payload: ToolTask, outcome: Outcome, attempt: int, token: str) -> Step:
        """Log the run, then have it run again later or file its result."""
        call, run_id = payload.call, payload.run_id
        delay = retry_delay(payload, outcome, attempt)
        log.info("call %s/%s tool=%s attempt=%d status=%s duration=%.3fs", run_id, call.id, call.name,
                 attempt, outcome.status, outcome.duration_secs)
        self.observers.run_ended(payload, outcome, attempt, delay)
        if delay is not None:
            self.leases.drop(run_id, call.id)  # idempotent: run again if a late soft limit cut it short
            self.ledger.await_retry(run_id, call.id, token, delay)
            return RunAgain(delay, payload)
        return self._finish(d, payload, outcome, attempt, token)

    def _refuse(self, payload: ToolTask, why: str, delivery_id: str | None) -> Refused:
        """Refuse the message; file the refusal only without a signing secret (see ``Refused``).

        Not filed as finished (``done=False``), so that running the turn again can still run the
        call; under a token no claim holds, so that a forged message cannot drop a running
        call's claim. With a secret a dispatcher never sends a refused message; one without it
        learns of the mismatch from the catalog.
        """
        call = payload.call
        log.error("refused call %s/%s (%s, tool %r): %s; nothing ran", payload.run_id[:100],
                  call.id[:100], delivery_id or "embedded", call.name[:100], why)
        result = refused_result(payload, why)
        if self.signing_secret is None:
            self._file(result, payload, "refused", done=False)
        self.observers.call_ended(payload, result)
        return Refused(why, result)

    # -- the ledger ------------------------------------------------------------------------------

    def _claim(self, payload: ToolTask, token: str) -> Claim:
        """The ledger's claim of the call; a forged result filed for it does not count as done.
        When Redis does not answer, nothing ran: ``StoreAway("claim")`` (the ledger's own retries
        waited a few seconds; a claim Redis took before the break is held until its lease runs out)."""
        run_id, call_id = payload.run_id, payload.call.id
        renewing = self.leases.claiming(run_id, call_id, token)
        try:
            claim = self.ledger.claim(run_id, call_id, token, payload.deadline)
            if claim.kind == "done" and self._evicted_forgery(run_id, call_id):
                claim = self.ledger.claim(run_id, call_id, token, payload.deadline)
        except BaseException as exc:
            if renewing:
                self.leases.drop(run_id, call_id)
            if not isinstance(exc, StoreUnavailable):
                raise
            if not self._refused(exc):
                self._store_errors.failed(exc)
            raise StoreAway("claim") from None
        if renewing and claim.kind != "claimed":
            self.leases.drop(run_id, call_id)
        self._store_errors.ok()
        return claim

    def _finish(
        self, d: Delivery, payload: ToolTask, outcome: Outcome, attempts: int, token: str
    ) -> Answered:
        """File the call's result, retrying while Redis is away with its lease still renewed (the
        call ran: better its result late than the call run again elsewhere)."""
        run_id, call_id = payload.run_id, payload.call.id
        result, done = filed_result(payload, outcome, attempts)
        self.leases.filing(run_id, call_id)
        for delay in FILE_RETRY_DELAYS:
            try:
                filed = self._file(result, payload, token, done=done, delivery_tag=d.delivery_tag)
                self._store_errors.ok()
                break
            except StoreUnavailable as exc:
                if not self._refused(exc):
                    self._store_errors.failed(exc)
                if delay is None:
                    self.leases.drop(run_id, call_id)
                    raise StoreAway("filing") from None
                pause(delay)
        self.leases.drop(run_id, call_id)
        if not filed and not self.replies:
            # Another run filed first (its result stands); a worker's dispatcher reads that one
            # itself, an embedded engine answers its caller with it.
            result = self.ledger.finished(run_id, [call_id]).get(call_id, result)
        self.observers.call_ended(payload, result)
        return Answered(result, outcome.error if filed else None)

    def _file(
        self, result: ToolResult, payload: ToolTask, token: str | None, *, done: bool,
        delivery_tag: str | None = None,
    ) -> bool:
        """``Ledger.finish``, signed when this runner has a secret; says whether it was filed."""
        run_id = payload.run_id
        reply_to = payload.reply_to if self.replies else None
        if self.signing_secret is not None:
            result = sign_result(result, self.signing_secret)
        filed = self.ledger.finish(result, run_id, token, reply_to, done=done, delivery_tag=delivery_tag)
        if not filed and self._evicted_forgery(run_id, result.call_id):
            filed = self.ledger.finish(result, run_id, token, reply_to, done=done)
        return filed

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

    # -- a process that died under a call (a prefork worker's parent) ----------------------------

    def process_lost(
        self, body: Any, *, hard_limit: bool, send_again: Callable[[ToolTask, str, float | None], None]
    ) -> None:
        """A call's process died (``hard_limit``: killed at its hard time limit). A timeout is a
        timeout like any other: a read-only or idempotent tool runs again, others end ``timeout``.
        A process that died otherwise sends the call again, bounded by the claim's count of runs
        (``too_many_runs``). ``send_again(payload, queue, countdown)`` publishes the call."""
        try:
            payload = ToolTask.model_validate(body)
        except ValidationError:
            return
        call, run_id = payload.call, payload.run_id
        tool = self.registry.get(call.name)
        self.observers.process_lost(payload, "hard_limit" if hard_limit else "worker_lost")
        if hard_limit:
            outcome = timed_out(call.name, payload.timeout_secs, payload.timeout_secs, stopped=True)
            starts = self.ledger.progress(run_id, [call.id])[call.id].starts
            delay = retry_delay(payload, outcome, starts) if tool is not None and tool.retryable else None
            if tool is not None and delay is not None:
                log.warning("call %s/%s was killed at its hard limit (run %d): running it again in %.1f s",
                            run_id, call.id, starts, delay)
                self.ledger.release(run_id, call.id)
                send_again(payload, tool.queue, delay)
                return
            result = call_result(payload, outcome, starts)
            self._file(result, payload, None, done=True)
            self.observers.call_ended(payload, result)
        elif tool is not None:
            log.warning("call %s/%s lost its process: sending it again", run_id, call.id)
            self.ledger.release(run_id, call.id)
            send_again(payload, tool.queue, None)
