"""Keeps this worker visible to dispatchers: a heartbeat per queue it serves, and the catalog's
publication of its tools on each beat. (The leases of its running calls are the runner's.)"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .._refusals import ErrorBurst
from ..store import Ledger
from ._credentials import stop_if_refused

log = logging.getLogger(__name__)


BeatHook = Callable[[str, list[str], bool], None]
"""Called with (worker, queues, stop) on every beat and at the stop: the tool catalog's publisher."""


class Heartbeat:
    """Tells dispatchers this worker serves its queues, every few seconds, until stopped."""

    def __init__(
        self,
        ledger: Ledger,
        worker: str,
        queues: list[str],
        interval: float = 3.0,
        also: BeatHook | None = None,
    ) -> None:
        self._ledger, self._worker, self._queues = ledger, worker, queues
        self._interval = interval
        self._also = also
        self._stop = threading.Event()
        self._errors = ErrorBurst(log, "heartbeat failed")
        self._thread = threading.Thread(target=self._loop, name="criogenai-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        try:
            self._ledger.heartbeat(self._worker, self._queues, stop=True)
            if self._also is not None:
                self._also(self._worker, self._queues, True)
        except Exception as exc:
            if not stop_if_refused(exc):  # a refusal was already said once
                log.warning("could not withdraw worker %s", self._worker, exc_info=True)

    def _loop(self) -> None:
        while True:
            try:
                # The catalog first: a worker seen alive has its tools published already.
                if self._also is not None:
                    self._also(self._worker, self._queues, False)
                self._ledger.heartbeat(self._worker, self._queues)
                self._errors.ok()
            except Exception as exc:
                if stop_if_refused(exc):
                    return
                self._errors.failed(exc)
            if self._stop.wait(self._interval):
                return
