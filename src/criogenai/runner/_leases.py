"""Keeps the claims of the calls running in this process alive.

A claim's lease runs out unless renewed; if its process dies, renewal stops and the call can be
run again elsewhere within one lease. One daemon thread per process renews every claim it holds,
and in the same round trip learns whether a call's turn was cancelled, then tells the call to stop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .._refusals import ErrorBurst
from ..store import Ledger

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews held claims every third of a lease, on one daemon thread started on first use."""

    def __init__(self, ledger: Ledger, refused: Callable[[BaseException], bool] = lambda _: False) -> None:
        self._ledger = ledger
        self._refused = refused
        """Says whether an error is a refusal of credentials, already handled (a worker stops on it)."""
        self._held: dict[tuple[str, str], str] = {}
        self._on_cancel: dict[tuple[str, str], Callable[[], None]] = {}
        self._warned: set[tuple[str, str]] = set()  # held calls already reported as lost
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._errors = ErrorBurst(log, "could not renew the leases of running calls")

    def claiming(self, run_id: str, call_id: str, token: str) -> bool:
        """Renew the call's claim from the moment the claim is made, before its caller resumes
        (on a loaded event loop that may take longer than a lease), until ``hold`` or ``drop``.
        Until ``hold`` a claim found not held is no loss: it may not be made yet, or be another's.
        False, doing nothing, when this process holds the call already (a second delivery)."""
        with self._lock:
            if (run_id, call_id) in self._held:
                return False
            self._held[(run_id, call_id)] = token
            self._warned.add((run_id, call_id))
            self._start()
        return True

    def hold(
        self, run_id: str, call_id: str, token: str, on_cancel: Callable[[], None] | None = None
    ) -> None:
        """Renew the call's claim until ``drop``; ``on_cancel`` is called once if its turn is cancelled."""
        with self._lock:
            self._held[(run_id, call_id)] = token
            self._warned.discard((run_id, call_id))
            if on_cancel is not None:
                self._on_cancel[(run_id, call_id)] = on_cancel
            self._start()

    def _start(self) -> None:
        """Start the renewing thread if it is not running (under the lock)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="criogenai-leases", daemon=True)
            self._thread.start()

    def filing(self, run_id: str, call_id: str) -> None:
        """The call ended and its result is being filed, which deletes its claim: a claim found
        gone from now on is the filing's doing, not a lost lease, and is not reported as lost.
        (Renewal goes on until ``drop``: a filing retried while Redis is away still holds it.)"""
        with self._lock:
            if (run_id, call_id) in self._held:
                self._warned.add((run_id, call_id))

    def drop(self, run_id: str, call_id: str) -> None:
        with self._lock:
            self._held.pop((run_id, call_id), None)
            self._on_cancel.pop((run_id, call_id), None)
            self._warned.discard((run_id, call_id))

    def stop_run(self, run_id: str) -> None:
        """Tell the calls of ``run_id`` running in this process to stop now (a cancel made here)."""
        with self._lock:
            stops = [self._on_cancel.pop(key) for key in list(self._on_cancel) if key[0] == run_id]
        for stop in stops:
            stop()

    def close(self) -> None:
        """Stop renewing (an embedded engine's close): its thread ends within a moment."""
        self._wake.set()

    def reset_after_fork(self) -> None:
        self._held.clear()
        self._on_cancel.clear()
        self._warned.clear()
        self._thread = None
        self._lock = threading.Lock()

    def _loop(self) -> None:
        interval = self._ledger.lease_secs / 3
        while not self._wake.wait(interval):
            with self._lock:
                held = [(run, call, token) for (run, call), token in self._held.items()]
            try:
                renewal = self._ledger.renew(held)
            except Exception as exc:  # Redis away for a moment: the next round tries again
                if self._refused(exc):
                    continue
                self._errors.failed(exc)
                continue
            self._errors.ok()
            for key in renewal.lost:
                # Still renewed (a no-op while it is not ours), so that a cancel still reaches it.
                with self._lock:
                    first = key in self._held and key not in self._warned  # else it just finished
                    if first:
                        self._warned.add(key)
                if first:
                    log.warning(
                        "call %s/%s lost its claim (its lease ran out or Redis restarted): it may "
                        "be run again elsewhere while it runs here",
                        *key,
                    )
            for key in renewal.cancelled:
                with self._lock:
                    stop = self._on_cancel.pop(key, None)
                if stop is not None:
                    log.info("call %s/%s: its turn was cancelled; stopping it", *key)
                    try:
                        stop()
                    except Exception:
                        log.warning("could not stop call %s/%s", *key, exc_info=True)
