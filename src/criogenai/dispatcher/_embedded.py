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


def _pool_for(app: Any) -> type:
    """Celery's threads pool, with this app current in its threads: a pool thread runs a task by
    looking its name up in the current app, and each embedded engine has an app of its own."""
    from celery.concurrency.thread import TaskPool

    class AppThreadPool(TaskPool):  # type: ignore[misc]
        def on_apply(self, target: Any, *args: Any, **kwargs: Any) -> Any:
            def in_app(*a: Any, **kw: Any) -> Any:
                app.set_current()
                return target(*a, **kw)

            return super().on_apply(in_app, *args, **kwargs)

    return AppThreadPool


def _own_memory_transport() -> type:
    """kombu's in-memory transport keeps its queues in class attributes, shared by every app of
    the process: each embedded engine gets its own, so one never takes another's calls."""
    from collections import defaultdict

    from kombu.transport import memory, virtual

    class Channel(memory.Channel):
        events: defaultdict[str, set[Any]] = defaultdict(set)
        queues: dict[str, Any] = {}

    class Transport(memory.Transport):
        global_state = virtual.BrokerState()  # type: ignore[no-untyped-call]

    Transport.Channel = Channel
    return Transport


class EmbeddedWorker:
    """A Celery WorkController on the threads pool, on a daemon thread of this process."""

    def __init__(self, app: Any, *, concurrency: int = 8) -> None:
        self._ready = threading.Event()
        app.conf.broker_transport = _own_memory_transport()
        self._worker = app.WorkController(
            app=app,
            pool_cls=_pool_for(app),
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
