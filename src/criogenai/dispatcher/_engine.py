"""The engine under a dispatcher: publishes calls on one thread, gathers results on another.

Results arrive on the dispatcher's own reply list, written by the worker in the same atomic step
that files the result under its run; nothing subscribes per call and nothing polls with sleeps.
A monitor looks at calls that take long: it finds results whose notice was lost, sends again a
call whose worker died (its lease ran out), and gives up on calls nobody picks up, so that every
call ends with a result within a bound.

With a signing secret, the engine accepts only results a worker signed with it (``_signing``),
wherever it reads them (its reply list, the run's results hash); the others are anyone's and are
dropped, and the call waits on for its real result within its usual bounds. Before publishing, it
ends at once the calls whose live workers (as the catalog shows them) have no secret or another.

Admission (``_admission``) holds back a turn's calls beyond its cap and calls over a fleet-wide
limit. Cancelling a run makes its unstarted calls unclaimable (``abandon``) and tells its running
ones to stop (the workers see the run's cancel mark when they renew their leases). A call reported
``not_started`` or ``lost`` is made unclaimable too (``abandon``, ``give_up``), so that a copy still
queued never runs after the model was told; re-dispatching the turn lifts that.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .._celery import celery_app
from .._config import Limits, Settings
from .._errors import StoreError
from .._keys import MAX_LOST_RUNS, Keys
from .._message import send_call
from .._refusals import ErrorBurst
from .._signing import authentic, key_id
from .._wire import ToolResult, ToolTask
from ..runner._outcomes import (
    Outcome,
    budget_secs,
    cancelled_before_start,
    closed_in_flight,
    ended,
    gave_no_result,
    kept_dying,
    not_admitted,
    not_run_again,
    not_started,
    store_lost_in_flight,
    unconfirmed_cancel,
)
from ..store import (
    Ledger,
    Limiter,
    check_server,
    ledger_catalog,
    make_limiter,
    redis_client,
    signing_mismatch,
)
from ._admission import Admission, Send
from ._publish import RedisPublisher

log = logging.getLogger(__name__)

CHECK_AFTER_SECS = 1.0
"""A call is first looked at by the monitor this long after it was published, then as often."""
SIGNERS_SECS = 5.0
"""How long what the catalog says of a tool's workers' signing secret is taken as still true."""


_Found = tuple[str, str, ToolResult]
"""A result read from Redis, with the run id and call id it was read as."""


@dataclass
class _Turn:
    future: concurrent.futures.Future[dict[str, ToolResult]]
    waiting: int
    results: dict[str, ToolResult] = field(default_factory=dict)


@dataclass
class _Pending:
    send: Send
    turn: _Turn
    published: float
    queue_deadline: float
    final_deadline: float
    next_check: float
    interval: float = CHECK_AFTER_SECS
    """Time to the next look; grows while nothing happens, so big backlogs cost little to watch."""
    started: bool = False
    suspect: tuple[float, int] | None = None
    redrives: int = 0
    resent_at: int = 0
    """Its start count when it was last sent again after a run that died: until the count grows,
    the new copy waits in the queue, a call not started (not a run that died once more)."""
    cancel_by: float | None = None
    """Its run was cancelled while it ran: the worker's ``cancelled`` result is due by then."""
    also: list[_Turn] = field(default_factory=list)
    """Other turns waiting for this call: its run id was sent again while it was in flight."""


def _budget_secs(p: ToolTask, limits: Limits, lease_secs: float) -> float:
    """A call's bound on a fleet: ``budget_secs`` plus the runs that may die under it, each seen
    within a lease and two checks."""
    dying_runs = (MAX_LOST_RUNS + 1) * (lease_secs + CHECK_AFTER_SECS * 2)
    return budget_secs(p, limits.queue_wait_secs, dying_runs + 10)


def _failure_name(exc: Exception) -> str:
    """What failed, for the model: behind a ``StoreError``, the Redis error it stands for."""
    cause = exc.__cause__ if isinstance(exc, StoreError) else None
    return type(cause or exc).__name__


class FleetEngine:
    """Publishing and gathering for one dispatcher, on two daemon threads."""

    def __init__(
        self,
        app: Any,
        ledger: Ledger,
        limits: Limits,
        *,
        prefix: str = "crg",
        publisher: RedisPublisher | None = None,
        limiter: Limiter | None = None,
        signing_secret: str | None = None,
    ) -> None:
        self.app = app
        self._secret = signing_secret
        self._key_id = key_id(signing_secret)
        self._catalog = ledger_catalog(ledger)
        self._signers: dict[str, tuple[float, str | None]] = {}
        """Tool name → (until when, why its live workers cannot serve this engine, or None)."""
        self._fast = publisher
        self.ledger = ledger
        self.limits = limits
        self.reply_to = Keys(prefix).reply(uuid.uuid4().hex)
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._server_id: str | None = None
        self._workers_seen: dict[str, set[str]] = {}
        # A started call is looked at least this often: a dead worker's call is re-sent within
        # about a lease and a quarter.
        self._max_interval = max(CHECK_AFTER_SECS, ledger.lease_secs / 4)
        self._worker_died_at: dict[str, float] = {}
        self._store_broke_at = -1.0
        """When this dispatcher's own connection to Redis last broke (see ``_check_unstarted``)."""
        self._pop_broke_at: dict[str, float] = {}
        """When this dispatcher learnt that a worker's pop of a queue broke (``pop_breaks``)."""
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._publisher = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="criogenai-publish"
        )
        self._cancelled: dict[str, float] = {}
        self._cancel_grace = ledger.lease_secs * 2 / 3 + 2.0
        """A running call told to stop has this long to file its ``cancelled`` result (its
        worker sees the mark at its next lease renewal, every third of a lease)."""
        self._admission: Admission[_Turn] = Admission(
            limiter or make_limiter(ledger, max(3.0, ledger.lease_secs)),
            self._launch,
            self._refuse,
            limits.max_calls_in_flight_per_turn,
        )
        self._gatherer = threading.Thread(target=self._gather_loop, name="criogenai-gather", daemon=True)
        self._gatherer.start()

    # -- submitting -------------------------------------------------------------------------------

    def submit(
        self, run_id: str, sends: list[Send], *, check_finished: bool, loop: object = None
    ) -> concurrent.futures.Future[dict[str, ToolResult]]:
        """Publish a turn's calls; the future gives every call's result, by call id. (``loop``,
        where the embedded engine runs calls, means nothing here: workers run them.)"""
        turn = _Turn(concurrent.futures.Future(), len(sends))
        if not sends:
            turn.future.set_result({})
            return turn.future
        self._publisher.submit(self._publish_turn, run_id, sends, turn, check_finished)
        return turn.future

    def _publish_turn(self, run_id: str, sends: list[Send], turn: _Turn, check_finished: bool) -> None:
        try:
            if check_finished:
                found = self.ledger.prepare(run_id, [s.payload.call.id for s in sends])
                for _, _, result in self._authentic(
                    [(run_id, cid, r) for cid, r in found.items()], "filed under the run"
                ):
                    self._settle(turn, result)
                sends = [s for s in sends if s.payload.call.id not in turn.results]
            sends = self._served(run_id, turn, sends)
            if self._closed.is_set():  # close() began after this was queued: end them here
                for s in sends:
                    self._refuse(run_id, turn, s, "closed")
                return
            if self._admission.needed(sends):
                self._admission.add(run_id, turn, sends)
                return
            now = time.monotonic()
            with self._lock:
                sends = [s for s in sends if self._track(run_id, turn, s, now, self.limits.queue_wait_secs)]
            self._send(sends)
        except Exception as exc:
            log.exception("could not publish a turn of run %s", run_id)
            self._not_sent(run_id, turn, sends, exc)

    def _track(self, run_id: str, turn: _Turn, s: Send, now: float, wait_secs: float) -> bool:
        """Watch the call for ``turn`` (under the lock); False when it is in flight already for
        another turn of its run (the run id was sent again meanwhile): ``turn`` then waits for
        that call's result, and nothing is sent again."""
        key = (run_id, s.payload.call.id)
        running = self._pending.get(key)
        if running is not None:
            running.also.append(turn)
            return False
        budget = _budget_secs(s.payload, self.limits, self.ledger.lease_secs)
        self._pending[key] = _Pending(
            s, turn, now, now + max(0.0, wait_secs), now + budget, now + CHECK_AFTER_SECS
        )
        return True

    def _not_sent(self, run_id: str, turn: _Turn, sends: list[Send], exc: Exception) -> None:
        """End calls whose publish failed. A failed round trip may still have delivered some: each
        call is first made unclaimable; one a worker already started stays pending, watched as usual."""
        reachable = True
        for s in sends:
            key = (run_id, s.payload.call.id)
            try:
                if reachable:
                    started = not self.ledger.abandon(run_id, key[1])
                    with self._lock:
                        if started and key in self._pending:
                            continue
            except Exception:  # Redis unreachable: reported unsent; only a message it kept could run
                log.warning("could not mark calls of run %s unsent", run_id, exc_info=True)
                reachable = False  # one timeout is enough: the publisher thread serves every turn
            why = f"the call could not be sent to the workers ({_failure_name(exc)})"
            result = ended(s.payload, not_started(s.payload.call.name, why))
            with self._lock:
                self._pending.pop((run_id, s.payload.call.id), None)
                self._settle(turn, result)
            self._admission.done(run_id, s.payload.call.id)

    # -- admission --------------------------------------------------------------------------------

    def _launch(self, run_id: str, turn: _Turn, sends: list[Send]) -> None:
        """Called by admission for calls it let in: publish them on the publisher thread."""
        try:
            self._publisher.submit(self._publish_admitted, run_id, turn, sends)
        except RuntimeError:  # the publisher was shut down: close() is under way
            for s in sends:
                self._refuse(run_id, turn, s, "closed")
                self._admission.done(run_id, s.payload.call.id)

    def _publish_admitted(self, run_id: str, turn: _Turn, sends: list[Send]) -> None:
        why = "cancelled" if run_id in self._cancelled else "closed" if self._closed.is_set() else None
        if why is not None:
            for s in sends:
                self._refuse(run_id, turn, s, why)
                self._admission.done(run_id, s.payload.call.id)
            return
        now, wall = time.monotonic(), time.time()
        try:
            with self._lock:  # the call's wait for a worker began before admission let it in
                sends = [s for s in sends if self._track(run_id, turn, s, now, s.payload.deadline - wall)]
            self._send(sends)
        except Exception as exc:
            log.exception("could not publish calls of run %s", run_id)
            self._not_sent(run_id, turn, sends, exc)

    def _refuse(self, run_id: str, turn: _Turn, send: Send, why: str) -> None:
        """End a call admission never published (see ``not_admitted``)."""
        outcome = not_admitted(send.payload.call.name, why, self.limits.queue_wait_secs)
        with self._lock:
            self._settle(turn, ended(send.payload, outcome))

    # -- cancelling -------------------------------------------------------------------------------

    def cancel(self, run_id: str) -> None:
        """Cancel a run fleet-wide: mark it (for every worker and dispatcher), then end this
        engine's calls of it: unpublished and unstarted ones now, running ones when they stop."""
        self.ledger.cancel(run_id)
        self._cancel_here(run_id)

    def _cancel_here(self, run_id: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._cancelled[run_id] = now
        for turn, s in self._admission.withdraw(run_id):
            self._refuse(run_id, turn, s, "cancelled")
        with self._lock:
            mine = [(cid, p) for (r, cid), p in self._pending.items() if r == run_id and p.cancel_by is None]
        for cid, p in mine:
            if self.ledger.abandon(run_id, cid):
                name = p.send.payload.call.name
                self._end(run_id, p.send.payload, cancelled_before_start(name))
            else:
                p.cancel_by = now + self._cancel_grace

    def _watch_cancels(self, now: float) -> None:
        """Runs cancelled elsewhere (another process, the CLI), and stopped calls overdue."""
        with self._lock:
            runs = {r for r, _ in self._pending}
            overdue = [
                (r, p) for (r, _), p in self._pending.items() if p.cancel_by is not None and now > p.cancel_by
            ]
        runs.update(self._admission.runs())
        fresh = [r for r in runs if r not in self._cancelled]
        for run_id in self.ledger.cancelled(fresh):
            log.info("run %s was cancelled", run_id)
            self._cancel_here(run_id)
        for run_id, p in overdue:
            name = p.send.payload.call.name
            self._end(run_id, p.send.payload, unconfirmed_cancel(name, self._cancel_grace))
        for run_id, at in list(self._cancelled.items()):
            if now - at > 3600:
                self._cancelled.pop(run_id, None)

    # -- signing --------------------------------------------------------------------------------

    def _authentic(self, found: list[_Found], where: str) -> list[_Found]:
        """The results (with the run and call ids they were read as) a worker signed with this
        engine's secret; all of them without a secret. The others are dropped with one warning
        for the lot, never shown: anyone who can write to Redis can put one there."""
        if self._secret is None:
            return found
        kept = [f for f in found if authentic(f[2], self._secret, f[0], f[1])]
        if len(kept) < len(found):
            log.warning(
                "dropped %d result(s) %s without a valid signature (forged, or filed by a worker "
                "without this dispatcher's signing secret); their calls wait on",
                len(found) - len(kept),
                where,
            )
        return kept

    def _served(self, run_id: str, turn: _Turn, sends: list[Send]) -> list[Send]:
        """The calls whose tool has a live worker with this engine's signing secret (or no record
        to judge by); the others end ``not_started`` now, unsent: their workers would refuse them
        without a word, or file results this engine must drop."""
        if self._catalog is None or not sends:
            return sends
        now = time.monotonic()
        names = {s.payload.call.name for s in sends}
        stale = sorted(n for n in names if n not in self._signers or self._signers[n][0] <= now)
        if stale:
            entries = self._catalog.read(stale)
            for name in stale:
                why = signing_mismatch(entries.get(name, []), self._key_id)
                if why is not None:
                    log.error("tool %r: %s; its calls end not_started (set CRIOGENAI_SIGNING_SECRET "
                              "to the same value on dispatchers and workers)", name, why)
                self._signers[name] = (now + SIGNERS_SECS, why)
        kept: list[Send] = []
        for s in sends:
            why = self._signers[s.payload.call.name][1]
            if why is None:
                kept.append(s)
                continue
            hint = f"{why}. Set the same CRIOGENAI_SIGNING_SECRET on dispatchers and workers"
            outcome = not_started(s.payload.call.name, hint)
            with self._lock:
                self._settle(turn, ended(s.payload, outcome))
        return kept

    def _send(self, sends: list[Send]) -> None:
        self._note_server()
        if self._fast is not None:
            self._fast.publish([(s.payload, s.queue) for s in sends])
            return
        with self.app.producer_or_acquire() as producer:
            for s in sends:
                send_call(self.app, s.payload, s.queue, producer=producer)

    # -- gathering --------------------------------------------------------------------------------

    def _settle(self, turn: _Turn, result: ToolResult) -> None:
        if result.call_id in turn.results:
            return
        turn.results[result.call_id] = result
        turn.waiting -= 1
        if turn.waiting == 0 and not turn.future.done():
            turn.future.set_result(turn.results)

    def _resolve(self, run_id: str, result: ToolResult) -> None:
        with self._lock:
            pending = self._pending.pop((run_id, result.call_id), None)
            if pending is not None:
                for turn in (pending.turn, *pending.also):
                    self._settle(turn, result)
        if pending is not None:
            self._admission.done(run_id, result.call_id)

    def _end(self, run_id: str, payload: ToolTask, outcome: Outcome) -> None:
        """End a call this dispatcher gives up on (or learns the end of) without a worker's result."""
        self._resolve(run_id, ended(payload, outcome))

    def _gather_loop(self) -> None:
        next_check = time.monotonic() + CHECK_AFTER_SECS / 2
        # Redis away or refusing this dispatcher: said once per burst, not on every attempt.
        reading = ErrorBurst(log, "cannot read results")
        checking = ErrorBurst(log, "cannot check calls in flight")
        while not self._closed.is_set():
            try:
                replies = self.ledger.pop_replies(self.reply_to, 0.25 if self._pending else 1.0)
                reading.ok()
            except Exception as exc:
                reading.failed(exc)
                self._store_broke_at = time.monotonic()
                self._closed.wait(0.5)
                replies = []
            if replies:
                for run_id, _, r in self._authentic(
                    [(r.run_id, r.call_id, r) for r in replies], "on the reply list"
                ):
                    self._resolve(run_id, r)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + CHECK_AFTER_SECS / 2
                try:
                    self._monitor(now)
                    checking.ok()
                except Exception as exc:
                    checking.failed(exc)
                    self._store_broke_at = time.monotonic()
        reading.close()
        checking.close()

    def _monitor(self, now: float) -> None:
        self._check_server(now)
        self._watch_cancels(now)
        with self._lock:
            due = [(k, p) for k, p in self._pending.items() if now >= p.next_check]
        by_run: dict[str, list[tuple[str, _Pending]]] = defaultdict(list)
        for (run_id, call_id), p in due:
            by_run[run_id].append((call_id, p))
        live = self._watch_workers({p.send.queue for _, p in due}, now)
        if self._fast is not None:
            for queue in self._fast.broken_pops({p.send.queue for _, p in due if not p.started}):
                self._pop_broke_at[queue] = now
        looks = self.ledger.look({run_id: [cid for cid, _ in items] for run_id, items in by_run.items()})
        filed = [(run_id, cid, r) for run_id in by_run for cid, r in looks[run_id].finished.items()]
        found = {(run_id, cid): r for run_id, cid, r in self._authentic(filed, "filed under their runs")}
        for run_id, items in by_run.items():
            progress = looks[run_id].progress
            for cid, p in items:
                p.next_check = now + p.interval
                p.interval = min(p.interval * 2, self._max_interval)
                if (run_id, cid) in found:
                    self._resolve(run_id, found[(run_id, cid)])
                    continue
                self._check(run_id, p, progress[cid].state, progress[cid].starts, now, live)

    def _watch_workers(self, queues: set[str], now: float) -> dict[str, bool]:
        """Which queues have a live worker; notes when a worker of a queue stops beating."""
        live: dict[str, bool] = {}
        for queue in queues:
            workers = set(self.ledger.live_workers(queue))
            if self._workers_seen.get(queue, set()) - workers:
                self._worker_died_at[queue] = now
            self._workers_seen[queue] = workers
            live[queue] = bool(workers)
        return live

    def _check(
        self, run_id: str, p: _Pending, state: str, starts: int, now: float, live: dict[str, bool]
    ) -> None:
        payload, name = p.send.payload, p.send.payload.call.name
        if now > p.final_deadline:
            self.ledger.give_up(run_id, payload.call.id)  # copies still queued must not run later
            self._end(run_id, payload, gave_no_result(name))
        elif state != "none":
            p.started, p.suspect = True, None
        elif starts == p.resent_at:  # never started, or its copy sent again waits in the queue
            self._check_unstarted(run_id, p, now, live)
        elif p.suspect is None or p.suspect[1] != starts:
            p.suspect = (now, starts)  # a run ended without a result: look once more, soon
            p.next_check, p.interval = now + CHECK_AFTER_SECS, CHECK_AFTER_SECS
        elif now - p.suspect[0] >= CHECK_AFTER_SECS * 0.9:
            self._redrive(run_id, p, now, starts)

    def _check_unstarted(self, run_id: str, p: _Pending, now: float, live: dict[str, bool]) -> None:
        payload, queue = p.send.payload, p.send.queue
        broke = max(self._worker_died_at.get(queue, -1.0), self._store_broke_at,
                    self._pop_broke_at.get(queue, -1.0))
        if broke > p.published:
            # The dead worker may have taken the message before it could start it, and that
            # message is not seen again for a visibility timeout. So may a worker whose pop was
            # in flight when its connection to Redis broke (it says so, or this dispatcher's broke
            # too): the server took the messages off the queue, and the reply carrying them was
            # lost. Sending it again is safe for any tool: a call never started cannot start
            # twice (the claim decides). Nothing ran, so it does not count as a run that died,
            # and its wait for a worker still counts from its first publish (a busy fleet under
            # repeated breaks would otherwise see its queued calls end "lost", or wait for ever).
            log.info("call %s/%s may have been taken off the queue unstarted; sending it again",
                     run_id, payload.call.id)
            self._resend(p, now)
            return
        no_worker = not live[queue] and now - p.published >= self.limits.no_worker_secs
        if not (now > p.queue_deadline or no_worker):
            return
        why = (
            f"no worker is serving queue {queue!r}"
            if no_worker
            else f"no worker was free within {self.limits.queue_wait_secs:g} s"
        )
        if p.resent_at:  # a run of it started, and died: it may have done part of its work
            self.ledger.give_up(run_id, payload.call.id)
            self._end(run_id, payload, not_run_again(payload.call.name, why))
        elif self.ledger.abandon(run_id, payload.call.id):
            self._end(run_id, payload, not_started(payload.call.name, why))

    def _note_server(self) -> None:
        """Take the server's id as the baseline before the first publish: a restart any time after
        it is then seen by the monitor (whose first pass comes half a second later)."""
        if self._server_id is None:
            server = self.ledger.server_id()
            with self._lock:
                if self._server_id is None:
                    self._server_id = server

    def _check_server(self, now: float) -> None:
        """Redis restarted without its data: queued messages, claims and results are gone."""
        server = self.ledger.server_id()
        with self._lock:
            previous, self._server_id = self._server_id, server
        if previous is None or previous == server:
            return
        with self._lock:
            pending = list(self._pending.items())
        log.warning("the Redis server restarted; %d call(s) in flight may be lost", len(pending))
        for (run_id, _), p in pending:
            if p.send.resend_safe:
                self._redrive(run_id, p, now, 0)  # the restarted server counts no starts
            else:
                self.ledger.give_up(run_id, p.send.payload.call.id)
                self._end(run_id, p.send.payload, store_lost_in_flight(p.send.payload.call.name))

    def _redrive(self, run_id: str, p: _Pending, now: float, starts: int) -> None:
        """Send a call whose run died (``starts`` runs so far) again, within its bound of such runs."""
        payload = p.send.payload
        p.redrives += 1
        p.suspect, p.resent_at = None, starts
        if p.redrives > payload.max_attempts + MAX_LOST_RUNS + 1:
            self.ledger.give_up(run_id, payload.call.id)  # the copies sent meanwhile must not run
            self._end(run_id, payload, kept_dying(payload.call.name))
            return
        log.warning("call %s/%s lost its worker; sending it again", run_id, payload.call.id)
        p.queue_deadline = now + self.limits.queue_wait_secs
        self._resend(p, now)

    def _resend(self, p: _Pending, now: float) -> None:
        """Publish the call once more and look at it again soon."""
        p.published, p.interval = now, CHECK_AFTER_SECS
        self._publisher.submit(self._send, [p.send])

    def close(self) -> None:
        """Stop; every call still in flight ends now (``lost``: it may still run and be filed under
        its run, where re-dispatching the turn finds it), so that no waiting turn hangs."""
        self._closed.set()
        try:
            self.ledger.wake(self.reply_to)  # the gatherer may be in a pop of up to a second
        except Exception:  # Redis away: the pop ends on its own timeout
            log.debug("could not wake the gatherer", exc_info=True)
        unsent = self._admission.close()
        self._publisher.shutdown(wait=True)
        self._gatherer.join(timeout=5)
        for run_id, turn, s in unsent:
            self._refuse(run_id, turn, s, "closed")
        with self._lock:
            left = list(self._pending.items())
        for (run_id, _), p in left:
            self._end(run_id, p.send.payload, closed_in_flight(p.send.payload.call.name))


def _redis_publisher(app: Any, settings: Settings) -> RedisPublisher | None:
    """The one-round-trip publisher when the broker is Redis; otherwise kombu's producer is used."""
    url = settings.broker_url or ""
    if not url.startswith(("redis://", "rediss://")):
        return None
    return RedisPublisher(app, redis_client(url))


def fleet_engine(settings: Settings, ledger: Ledger, limits: Limits) -> FleetEngine:
    """The engine of a dispatcher with a broker: a Celery app to publish with, on ``ledger``."""
    check_server(ledger, login=False)  # refused logins end calls with the reason
    app = celery_app(settings)
    return FleetEngine(
        app,
        ledger,
        limits,
        prefix=settings.key_prefix,
        publisher=_redis_publisher(app, settings),
        signing_secret=settings.signing_secret,
    )
