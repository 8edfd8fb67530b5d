"""Admission: holds back a turn's calls over its cap or over a fleet-wide limit, and publishes them
in order as room frees.

A turn keeps at most ``max_calls_in_flight_per_turn`` calls published or waiting at a gate; the
rest follow in call order as results come in. A call with gates (``store._limits``) is published once
it holds a place in each. Waiting is bounded: a call that did not get in before its deadline (the
same ``queue_wait_secs`` that bounds its wait in the queue) ends ``not_started`` and never runs.
One daemon thread does the Redis work; it wakes when a result frees room, and looks again every
``POLL_SECS`` while calls wait at a gate (another dispatcher's call may have ended).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .._keys import task_id
from .._wire import ToolTask
from ..store import Gate, Limiter

log = logging.getLogger(__name__)

POLL_SECS = 0.1
"""How often calls waiting at a gate ask again when nothing local wakes them."""


@dataclass(frozen=True, slots=True)
class Send:
    """One call to publish, with the queue of its tool."""

    payload: ToolTask
    queue: str
    resend_safe: bool
    """The tool is read-only or idempotent: sending the call again cannot do harm."""
    gates: tuple[Gate, ...] = ()
    """Fleet-wide concurrency and rate limits the call must get a place in before it is published."""


T = TypeVar("T")
"""The engine's own record of a turn, passed back to it untouched."""


@dataclass
class _TurnRoom(Generic[T]):
    run_id: str
    turn: T
    queued: deque[Send]
    cap: int
    gated: list[Send] = field(default_factory=list)
    in_flight: set[str] = field(default_factory=set)


Launch = Callable[[str, T, list[Send]], None]
"""Publish calls that were let in (the engine's)."""
Refuse = Callable[[str, T, Send, str], None]
"""End a call that was never published: (run, turn, call, why)."""


def member(run_id: str, call_id: str) -> str:
    """A call's name in the gates: its Celery task id."""
    return task_id(run_id, call_id)


class Admission(Generic[T]):
    """Per-turn caps and fleet-wide gates for one engine, on one daemon thread."""

    def __init__(self, limiter: Limiter, launch: Launch[T], refuse: Refuse[T], cap: int) -> None:
        self._limiter = limiter
        self._launch = launch
        self._refuse = refuse
        self.cap = cap
        self._rooms: dict[str, list[_TurnRoom[T]]] = {}
        self._held: dict[str, tuple[Gate, ...]] = {}
        self._to_release: list[tuple[tuple[Gate, ...], str]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="criogenai-admission", daemon=True)
        self._thread.start()

    def needed(self, sends: Sequence[Send]) -> bool:
        return len(sends) > self.cap or any(s.gates for s in sends)

    def add(self, run_id: str, turn: T, sends: list[Send]) -> None:
        with self._lock:
            self._rooms.setdefault(run_id, []).append(_TurnRoom(run_id, turn, deque(sends), self.cap))
        self._wake.set()

    def runs(self) -> list[str]:
        with self._lock:
            return list(self._rooms)

    def done(self, run_id: str, call_id: str) -> None:
        """A published call ended: give back its places and its turn's room. Cheap; no I/O here."""
        with self._lock:
            rooms = self._rooms.get(run_id)
            if rooms is None:
                return
            m = member(run_id, call_id)
            gates = self._held.pop(m, None)
            if gates:
                self._to_release.append((gates, m))
            for room in rooms:  # every turn of the run waiting for it (a run id sent again joins)
                room.in_flight.discard(call_id)
            self._tidy(run_id)
        self._wake.set()

    def _tidy(self, run_id: str) -> None:
        """Forget the run's turns that have nothing left here (under the lock)."""
        rooms = [r for r in self._rooms.get(run_id, []) if r.queued or r.gated or r.in_flight]
        if rooms:
            self._rooms[run_id] = rooms
        else:
            self._rooms.pop(run_id, None)

    def withdraw(self, run_id: str) -> list[tuple[T, Send]]:
        """Take back every call of the run not published yet (its turn was cancelled)."""
        out: list[tuple[T, Send]] = []
        with self._lock:
            for room in self._rooms.get(run_id, []):
                for s in room.gated:
                    out.append((room.turn, s))
                    self._to_release.append((s.gates, member(run_id, s.payload.call.id)))
                out.extend((room.turn, s) for s in room.queued)
                room.gated.clear()
                room.queued.clear()
            self._tidy(run_id)
        self._wake.set()
        return out

    def close(self) -> list[tuple[str, T, Send]]:
        """Stop the thread and give back every place and queue spot this engine holds; returns the
        calls it never published, for the engine to end."""
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout=5)
        unsent: list[tuple[str, T, Send]] = []
        with self._lock:
            pending = list(self._to_release)
            pending += [(g, m) for m, g in self._held.items()]
            for rooms in self._rooms.values():
                for room in rooms:
                    pending += [(s.gates, member(room.run_id, s.payload.call.id)) for s in room.gated]
                    unsent += [(room.run_id, room.turn, s) for s in (*room.gated, *room.queued)]
            self._rooms.clear()
            self._to_release.clear()
            self._held.clear()
        self._release(pending)
        return unsent

    # -- the thread -------------------------------------------------------------------------------

    def _loop(self) -> None:
        renew_every = self._limiter.lease_secs / 3
        next_renew = time.monotonic() + renew_every
        while not self._closed.is_set():
            self._wake.clear()
            waiting = False
            try:
                with self._lock:
                    release, self._to_release = self._to_release, []
                self._release(release)
                waiting = self._step()
                if time.monotonic() >= next_renew:
                    next_renew = time.monotonic() + renew_every
                    self._renew()
            except Exception:
                log.warning("cannot admit calls; trying again", exc_info=True)
                waiting = True
            self._wake.wait(POLL_SECS if waiting else renew_every)


    def _step(self) -> bool:
        """Move calls forward; True while some wait at a gate."""
        now = time.time()
        launches: list[tuple[str, T, list[Send]]] = []
        refusals: list[tuple[str, T, Send, str]] = []
        groups: dict[tuple[Gate, ...], list[tuple[_TurnRoom[T], Send]]] = {}
        with self._lock:
            rooms = [room for rs in self._rooms.values() for room in rs]
        for room in rooms:
            with self._lock:
                ready = self._sort_out(room, now, refusals, groups)
            if ready:
                launches.append((room.run_id, room.turn, ready))
        waiting = False
        for gates, items in groups.items():
            try:
                n = self._limiter.admit(gates, [member(r.run_id, s.payload.call.id) for r, s in items])
            except Exception:  # Redis away: these wait for the next step; the rest still moves
                log.warning("cannot take places at %s; trying again", [g.name for g in gates], exc_info=True)
                n, waiting = 0, True
            with self._lock:
                for room, s in items[:n]:
                    if s not in room.gated:  # withdrawn meanwhile: give the place back
                        self._to_release.append((gates, member(room.run_id, s.payload.call.id)))
                        continue
                    room.gated.remove(s)
                    room.in_flight.add(s.payload.call.id)
                    self._held[member(room.run_id, s.payload.call.id)] = gates
                    launches.append((room.run_id, room.turn, [s]))
        for run_id, turn, sends in launches:
            self._launch(run_id, turn, sends)
        for run_id, turn, s, why in refusals:
            self._refuse(run_id, turn, s, why)
        with self._lock:
            for run_id in {r.run_id for r in rooms}:
                self._tidy(run_id)
            return waiting or any(room.gated for rs in self._rooms.values() for room in rs)

    def _sort_out(
        self,
        room: _TurnRoom[T],
        now: float,
        refusals: list[tuple[str, T, Send, str]],
        groups: dict[tuple[Gate, ...], list[tuple[_TurnRoom[T], Send]]],
    ) -> list[Send]:
        """Under the lock: fill the turn's room in call order; returns the calls free to go now,
        adds its calls waiting at gates to ``groups`` and those whose wait ran out to ``refusals``."""
        ready: list[Send] = []
        while room.queued and len(room.gated) + len(room.in_flight) < room.cap:
            s = room.queued.popleft()
            if s.payload.deadline < now:
                refusals.append((room.run_id, room.turn, s, "turn"))
            elif s.gates:
                room.gated.append(s)
            else:
                room.in_flight.add(s.payload.call.id)
                ready.append(s)
        for s in list(room.gated):
            if s.payload.deadline < now:
                room.gated.remove(s)
                self._to_release.append((s.gates, member(room.run_id, s.payload.call.id)))
                refusals.append((room.run_id, room.turn, s, "gate"))
            else:
                groups.setdefault(s.gates, []).append((room, s))
        while room.queued and room.queued[0].payload.deadline < now:  # held back by the cap too long
            refusals.append((room.run_id, room.turn, room.queued.popleft(), "turn"))
        return ready

    def _renew(self) -> None:
        with self._lock:
            by_gates: dict[tuple[Gate, ...], list[str]] = {}
            for m, gates in self._held.items():
                by_gates.setdefault(gates, []).append(m)
        for gates, members in by_gates.items():
            self._limiter.renew(gates, members)

    def _release(self, items: list[tuple[tuple[Gate, ...], str]]) -> None:
        by_gates: dict[tuple[Gate, ...], list[str]] = {}
        for gates, m in items:
            by_gates.setdefault(gates, []).append(m)
        for gates, members in by_gates.items():
            try:
                self._limiter.release(gates, members)
            except Exception:  # the places come back when their lease ends
                log.warning("could not give back %d place(s)", len(members), exc_info=True)
