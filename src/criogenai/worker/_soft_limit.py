"""A prefork child takes Celery's soft time limit only while a call runs in it.

Billiard's main process sends the soft limit (SIGUSR1) from its timer once a task has run that
long. When the call ended at that same moment by its own time limit (an async tool's), the signal
lands after the task: in the child's wait for its next job, or while it sends its result back,
where billiard's handler raises and the child dies (exit code 1) or its result is lost, with
ERROR lines in the worker's log. Out of a call the signal has nothing to stop, so it is ignored.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from billiard.exceptions import SoftTimeLimitExceeded
from billiard.pool import soft_timeout_sighandler

_SOFT_LIMIT = getattr(signal, "SIGUSR1", None)
_in_call = False


def _soft_limit(signum: int, frame: FrameType | None) -> None:
    if _in_call:
        raise SoftTimeLimitExceeded()


@contextlib.contextmanager
def soft_limit_only_in_call() -> Iterator[None]:
    """Run a call inside the block: a soft limit raises there and is ignored anywhere else.
    Takes the place of billiard's handler the first time it runs in a child."""
    global _in_call
    if (
        _SOFT_LIMIT is not None
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(_SOFT_LIMIT) is soft_timeout_sighandler
    ):
        signal.signal(_SOFT_LIMIT, _soft_limit)
    _in_call = True
    try:
        yield
    finally:
        _in_call = False
