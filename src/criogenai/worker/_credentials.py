"""A worker whose credentials Redis refuses stops, whenever they are refused, with one line.

At start ``check_server`` catches a refusal. Later ones (a worker started before Redis with a
wrong password, a password rotated while it runs, a client certificate a TLS server asks for)
reach Celery as connection errors, which it retries for ever: the worker would live on, logging
"Trying again", serving nothing. Here the transport turns a refusal into ``CredentialsRefused``,
which no one retries, the consumer ends the worker on it, and the worker's own threads ask Celery
to stop through ``state.should_stop``, which the consumer checks about every second.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.exceptions import WorkerShutdown
from celery.worker import state
from celery.worker.consumer import Consumer as _CeleryConsumer

from .._errors import ConfigurationError
from .._refusals import refusal
from . import _transport

log = logging.getLogger(__name__)

EXIT_REFUSED = 2
"""The worker's exit status on refused credentials, later as at start (``criogenai`` exits 2)."""

_stop_lock = threading.Lock()
_stopping = False


class CredentialsRefused(ConfigurationError):
    """Redis refused the URL's credentials or this client's TLS certificate."""


def stop_worker(why: str) -> None:
    """Log ``why`` once and ask Celery to stop this worker with ``EXIT_REFUSED``."""
    global _stopping
    with _stop_lock:
        if _stopping:
            return
        _stopping = True
    log.critical("%s: stopping the worker", why)
    state.should_stop = EXIT_REFUSED


def exit_status() -> int:
    """What ``criogenai worker`` exits with once Celery's worker returned: ``worker_main`` drops
    the status Celery's worker stopped with."""
    return EXIT_REFUSED if _stopping else 0


def stop_if_refused(exc: BaseException) -> bool:
    """For the worker's own threads: stop the worker if ``exc`` is a refusal; say whether it was."""
    why = refusal(exc)
    if why is None:
        return False
    stop_worker(why)
    return True


class _QoS(_transport.QoS):
    """Acknowledgements that stop the worker, in one line, when Redis refuses its credentials
    (a password rotated under a running worker) instead of failing with a traceback per call."""

    def ack(self, delivery_tag: str) -> None:
        try:
            super().ack(delivery_tag)
        except Exception as exc:
            if not stop_if_refused(exc):
                raise


class _Channel(_transport.Channel):
    QoS = _QoS


class Transport(_transport.Transport):
    """criogenai's Redis transport, whose connections are not retried when Redis refuses them."""

    Channel = _Channel

    def establish_connection(self) -> Any:
        try:
            return super().establish_connection()
        except Exception as exc:  # a new channel's first command: its PING
            why = refusal(exc, fresh=True)
            if why is None:
                raise
            raise CredentialsRefused(why) from None



class Consumer(_CeleryConsumer):  # type: ignore[misc]
    """Celery's consumer, ending the worker when its connection is refused (``worker_consumer``)."""

    def start(self) -> None:
        try:
            super().start()
        except CredentialsRefused as exc:
            stop_worker(str(exc))
            raise WorkerShutdown(EXIT_REFUSED) from None

