"""The embedded engine: runs a turn's calls in this process, without Celery or a broker.

It has the fleet engine's interface (``submit``, ``ledger``, ``reply_to``, ``close``) and hands
each delivery of a call to the same runner a worker uses (``runner._call``: signature check,
claim, time limit, retries for read-only and idempotent tools, filing); it only adapts the
runner's steps, as its table says. Calls run as greenlets on the caller's event loop (``await
run_turn``; the process's loop for ``run_turn_sync``): an async tool is awaited there, a sync one
runs on a tool thread the greenlet waits for without holding one. One more thread starts retries
when due and gives up on calls past their bound, so that every call ends with a result; the
runner's lease keeper renews the claims of running calls and stops those whose run is cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .._config import Limits
from .._errors import StoreError
from .._keys import Keys
from .._loop import GreenletRunner
from .._wire import ToolResult
from ..runner import Answered, CallRunner, Delivery, Refused, RunAgain, StoreAway
from ..runner._outcomes import (
    Outcome,
    budget_secs,
    closed_in_flight,
    ended,
    gave_no_result,
    not_admitted,
    not_started,
)
from ..store import Ledger, MemoryLimiter
from ..tools import ToolRegistry
from ._admission import Admission, Send
from ._seam import Gathered

log = logging.getLogger(__name__)

SLOTS = 1024
"""Calls running at once in one engine; more wait their turn, within ``queue_wait_secs``. A
running call costs a greenlet on the process loop (``_loop``), plus a thread while a sync
tool runs."""
WATCH_SECS = 1.0
"""How often the watch thread looks for calls past their bound."""
BUSY_RECHECK_SECS = 0.25
"""How soon a call held by another run of the same turn is looked at again."""
STORE_RECHECK_SECS = 1.0
"""How soon a call whose claim the ledger did not answer is tried again."""


@dataclass
class _Turn:
    future: concurrent.futures.Future[dict[str, ToolResult]]
    waiting: int
    loop: asyncio.AbstractEventLoop | None = None
    """The caller's event loop (``await run_turn``): its calls run there, async tools included."""
    results: Gathered = field(default_factory=Gathered)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True, slots=True, eq=False)
class _Call:
    send: Send
    turn: _Turn
    final_deadline: float
    """Monotonic time past which the call is given up as ``lost`` (a worker's bound, plus slack)."""


class InProcessEngine:
    """Runs calls on this process's threads with the worker's rules; see the module's docstring."""

    def __init__(
        self,
        registry: ToolRegistry,
        ledger: Ledger,
        limits: Limits,
        *,
        prefix: str = "crg",
        signing_secret: str | None = None,
    ) -> None:
        self.ledger = ledger
        self.limits = limits
        self.runner = CallRunner(
            registry, ledger, host="embedded", signing_secret=signing_secret, replies=False
        )
        """Runs each delivery as a worker's does; with a secret, only calls signed with it run."""
        self.reply_to = Keys(prefix).reply(f"embedded-{uuid.uuid4().hex}")
        """Carried in each call's task, as the fleet's; results come back directly, not through it."""
        self._slots = GreenletRunner(SLOTS)
        self._on_loops: dict[asyncio.AbstractEventLoop, GreenletRunner] = {}
        """Runners on the callers' loops; a closed loop's is dropped at the next start."""
        self._lock = threading.Condition()
        self._calls: set[_Call] = set()
        """Calls submitted and not answered yet (the watch gives up on them past their bound)."""
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._closed = False
        self._admission: Admission[_Turn] = Admission(
            MemoryLimiter(ledger.lease_secs), self._launch, self._refuse, limits.max_calls_in_flight_per_turn
        )
        self._watcher = threading.Thread(target=self._watch_loop, name="criogenai-embedded", daemon=True)
        self._watcher.start()

    # -- submitting -------------------------------------------------------------------------------

    def submit(
        self,
        run_id: str,
        sends: list[Send],
        *,
        check_finished: bool,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> concurrent.futures.Future[dict[str, ToolResult]]:
        """Run a turn's calls, on ``loop`` when the caller awaits on one (async tools then run on
        the application's loop, beside its own futures and pools), else on the process loop; the
        future gives every call's result, by call id."""
        turn = _Turn(concurrent.futures.Future(), len(sends), loop)
        if check_finished and sends:
            for result in self.ledger.prepare(run_id, [s.payload.call.id for s in sends]).values():
                self._settle(turn, result)
            sends = [s for s in sends if s.payload.call.id not in turn.results]
        if not sends:
            if not turn.future.done():
                turn.future.set_result(turn.results)
            return turn.future
        if self._closed:
            raise RuntimeError("the dispatcher is closed")
        if self._admission.needed(sends):  # over the turn's cap, or behind a concurrency or rate limit
            self._admission.add(run_id, turn, sends)
        else:
            self._launch(run_id, turn, sends)
        return turn.future

    def _launch(self, run_id: str, turn: _Turn, sends: list[Send]) -> None:
        now = time.monotonic()
        calls = [_Call(s, turn, now + budget_secs(s.payload, self.limits.queue_wait_secs)) for s in sends]
        with self._lock:
            closed = self._closed
            if not closed:
                self._calls.update(calls)
        if closed:  # close() is under way and may have taken its list of calls already
            for s in sends:
                self._refuse(run_id, turn, s, "closed")
            return
        for c in calls:
            self._start(c)

    def _refuse(self, run_id: str, turn: _Turn, send: Send, why: str) -> None:
        outcome = not_admitted(send.payload.call.name, why, self.limits.queue_wait_secs)
        self._settle(turn, ended(send.payload, outcome))

    def cancel(self, run_id: str) -> None:
        """Cancel a run: calls not started never run, running ones are told to stop now."""
        self.ledger.cancel(run_id)
        for turn, s in self._admission.withdraw(run_id):
            self._refuse(run_id, turn, s, "cancelled")
        self.runner.leases.stop_run(run_id)

    def _start(self, c: _Call) -> None:
        if self._closed:  # close() answers for the call
            return
        loop = c.turn.loop
        if loop is None or loop.is_closed():  # a retry due after the caller's loop ended
            self._slots.submit(self._run, c)
            return
        with self._lock:
            for closed in [c for c in self._on_loops if c.is_closed()]:
                del self._on_loops[closed]
            runner = self._on_loops.get(loop)
            if runner is None:
                runner = self._on_loops[loop] = GreenletRunner(SLOTS, loop)
        runner.submit(self._run, c)

    # -- one call, as a worker runs it ------------------------------------------------------------

    def _run(self, c: _Call) -> None:
        with self._lock:
            if c not in self._calls:  # answered already (given up past its bound): not run again
                return
        payload = c.send.payload
        try:
            result = self._attempt(c)
        except Exception as exc:
            log.exception("call %s/%s: the embedded engine failed", payload.run_id, payload.call.id)
            result = ended(payload, Outcome(
                "lost",
                f"Tool {payload.call.name!r} gave no result: the embedded engine failed "
                f"({type(exc).__name__}); the call may or may not have run.",
            ))
        if result is not None:
            self._answer(c, result)

    def _attempt(self, c: _Call) -> ToolResult | None:
        """One delivery of the call through the runner: its result, or None when it runs again later."""
        payload = c.send.payload
        # The tool gets its own copy of the arguments, as decoded from a message on a worker.
        arguments = json.loads(json.dumps(payload.call.arguments))
        own = payload.model_copy(update={"call": payload.call.model_copy(update={"arguments": arguments})})
        try:
            step = self.runner.run(Delivery(own))
        except StoreAway as away:
            if away.stage == "claim":  # nothing ran: try again in a moment, within the call's bound
                self._later(STORE_RECHECK_SECS, c)
                return None
            return ended(payload, Outcome(
                "lost", f"Tool {payload.call.name!r} gave no result: its result could not be filed "
                "(the ledger did not answer); the call ran.",
            ))
        if isinstance(step, Answered) and step.error is not None:
            c.turn.results.causes[payload.call.id] = step.error
        if isinstance(step, Answered | Refused):
            return step.result
        if isinstance(step, RunAgain):
            self._later(step.delay, c)
            return None
        return self._not_run(c, step.kind)

    def _not_run(self, c: _Call, kind: str) -> ToolResult | None:
        """The engine is the call's dispatcher too: it answers for a call this delivery did not run."""
        payload = c.send.payload
        call, run_id = payload.call, payload.run_id
        if kind == "done":
            found = self.ledger.finished(run_id, [call.id]).get(call.id)
            if found is not None:
                return found
        if kind == "busy":  # another run of this turn holds it: its result will be filed
            self._later(BUSY_RECHECK_SECS, c)
            return None
        why = f"no worker was free within {self.limits.queue_wait_secs:g} s"
        return ended(payload, not_started(call.name, why))

    def _answer(self, c: _Call, result: ToolResult) -> None:
        with self._lock:
            self._calls.discard(c)
        self._settle(c.turn, result)
        self._admission.done(c.send.payload.run_id, result.call_id)

    def _settle(self, turn: _Turn, result: ToolResult) -> None:
        with turn.lock:
            if result.call_id in turn.results:
                return
            turn.results[result.call_id] = result
            turn.waiting -= 1
            last = turn.waiting == 0
        if last and not turn.future.done():
            turn.future.set_result(turn.results)

    # -- the watch thread: timers, leases, bounds -------------------------------------------------

    def _later(self, delay: float, c: _Call) -> None:
        with self._lock:
            when = time.monotonic() + delay
            heapq.heappush(self._timers, (when, next(self._order), lambda: self._start(c)))
            self._lock.notify()

    def _watch_loop(self) -> None:
        next_watch = time.monotonic() + WATCH_SECS
        while True:
            with self._lock:
                now = time.monotonic()
                wake = min(next_watch, self._timers[0][0]) if self._timers else next_watch
                if not self._closed and wake > now:
                    self._lock.wait(wake - now)
                if self._closed:
                    return
                now = time.monotonic()
                due = []
                while self._timers and self._timers[0][0] <= now:
                    due.append(heapq.heappop(self._timers)[2])
            for start in due:
                start()
            if now >= next_watch:
                next_watch = now + WATCH_SECS
                try:
                    self._watch(now)
                except Exception:
                    log.warning("cannot check calls in flight; trying again", exc_info=True)

    def _watch(self, now: float) -> None:
        with self._lock:
            overdue = [c for c in self._calls if now > c.final_deadline]
        for c in overdue:
            payload = c.send.payload
            try:
                self.ledger.give_up(payload.run_id, payload.call.id)
            except StoreError:  # the call is answered all the same: its bound has passed
                log.warning("call %s/%s: could not mark it given up; answering it lost",
                            payload.run_id, payload.call.id, exc_info=True)
            self._answer(
                c,
                ended(payload, gave_no_result(payload.call.name)),
            )

    def close(self) -> None:
        """Stop the watch thread; calls still in flight end ``lost`` (they may finish unobserved)."""
        with self._lock:
            self._closed = True
            self._lock.notify()
            self._timers.clear()
        for run_id, turn, s in self._admission.close():
            self._refuse(run_id, turn, s, "closed")
        self._watcher.join(timeout=5)
        self.runner.leases.close()
        with self._lock:  # taken last: admission may have launched calls until it stopped
            left = list(self._calls)
        for c in left:
            payload = c.send.payload
            self._answer(
                c,
                ended(payload, closed_in_flight(payload.call.name)),
            )
