"""The embedded default: Celery's own worker in this process, on kombu's in-memory transport.

The same task, executor and dispatcher run as on a fleet, so the README's demo needs no server.
What differs: one process, so a sync tool past its limit is abandoned on its thread rather than
killed, and nothing survives the process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

log = logging.getLogger(__name__)


class EmbeddedWorker:
    """A Celery WorkController on the threads pool, on a daemon thread of this process."""

    def __init__(self, app: Any, *, concurrency: int = 8) -> None:
        self._ready = threading.Event()
        self._worker = app.WorkController(
            app=app,
            pool_cls="threads",
            concurrency=concurrency,
            hostname=f"embedded-{os.getpid()}@{socket.gethostname()}",
            loglevel=logging.WARNING,
            ready_callback=lambda _consumer: self._ready.set(),
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
        )
        self._thread = threading.Thread(target=self._worker.start, name="criogenai-embedded", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        waited = 0.0
        while not self._ready.wait(0.05):
            waited += 0.05
            if not self._thread.is_alive() or waited > timeout:
                raise RuntimeError("the embedded worker did not start; see the log for why")

    def stop(self) -> None:
        try:
            self._worker.stop(in_sighandler=False, exitcode=0)
        except Exception:
            log.debug("embedded worker stop", exc_info=True)
        self._thread.join(timeout=5)
