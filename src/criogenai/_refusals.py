"""Telling Redis refusing who we are from Redis being away, and logging failures once per burst.

redis-py raises a refused password or ACL user as ``AuthenticationError``, a ``ConnectionError``:
Celery, kombu and redis-py's own retries take it for an outage and try again for ever. A refusal
does not heal by waiting, so workers stop on it (``worker/_credentials``) and dispatchers end
their calls with it; both log it once.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time

from ._errors import StoreError

_CERTIFICATE_ALERTS = (
    "ALERT_CERTIFICATE_REQUIRED",
    "ALERT_BAD_CERTIFICATE",
    "ALERT_UNKNOWN_CA",
    "ALERT_CERTIFICATE_UNKNOWN",
    "ALERT_CERTIFICATE_EXPIRED",
    "ALERT_CERTIFICATE_REVOKED",
)
"""TLS alerts a server sends when it does not accept the client's certificate."""


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and those it was raised from or during (redis-py wraps ``ssl`` errors)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def refusal(exc: BaseException, *, fresh: bool = False) -> str | None:
    """Why Redis refused this client, or None when ``exc`` is not a refusal (an outage, a bug).

    ``fresh``: ``exc`` came from a connection's first command. A TLS server that asks for a
    client certificate (``tls-auth-clients yes``) and gets none closes the connection right after
    the handshake, which the client sees only as an unexpected EOF; on a connection that worked
    before, the same EOF is an outage. No password is in the text: Redis's replies never echo it.
    """
    import redis  # loaded already when ``exc`` is one of its errors

    for err in _chain(exc):
        if isinstance(err, redis.AuthenticationError):
            return f"Redis refused the credentials in the URL ({err})"
        text = str(err)
        if "CERTIFICATE_VERIFY_FAILED" in text:
            return f"Redis's TLS certificate was not accepted ({text})"
        alert = any(name in text for name in _CERTIFICATE_ALERTS)
        if alert or (fresh and isinstance(err, ssl.SSLEOFError)):
            return (
                "Redis did not accept this client's TLS certificate, or needs one the URL does not "
                f"give (ssl_certfile, ssl_keyfile): {text}"
            )
    return None


def describe(exc: BaseException) -> str:
    """One line for a failed Redis round trip: the refusal, else the exception's type and text."""
    return refusal(exc) or f"{type(exc).__name__}: {exc}"


class ErrorBurst:
    """Logs a run of failures of one repeated step once when it starts, with a traceback only for
    errors that are not Redis's, and once when it ends, with how many attempts failed."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._log, self._what = logger, what
        self._failures = 0
        self._since = 0.0
        self._lock = threading.Lock()  # one step may fail on many threads at once (a worker's calls)

    def failed(self, exc: Exception) -> None:
        import redis

        with self._lock:
            self._failures += 1
            if self._failures > 1:
                return
            self._since = time.monotonic()
        self._log.warning(
            "%s: %s; trying again (logged once until it works)",
            self._what,
            describe(exc),
            exc_info=None if isinstance(exc, redis.RedisError | StoreError) else exc,
        )

    def ok(self) -> None:
        """The step worked: end the burst, if any, saying how long it lasted (no lock when none)."""
        if not self._failures:
            return
        with self._lock:
            failures, self._failures = self._failures, 0
        if failures:
            self._log.warning(
                "%s: works again after %d failed attempt(s) over %.1f s",
                self._what,
                failures,
                time.monotonic() - self._since,
            )

    def close(self) -> None:
        """The step will not be tried again: end the burst, if any, saying so."""
        if self._failures:
            self._log.warning(
                "%s: gave up after %d failed attempt(s) over %.1f s",
                self._what,
                self._failures,
                time.monotonic() - self._since,
            )
        self._failures = 0
