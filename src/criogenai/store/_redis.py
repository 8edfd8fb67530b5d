"""The one way criogenai connects to Redis, and the one place redis-py's errors become criogenai's.

Every client is made by ``redis_client``, with one set of timeouts, health checks and retries,
and a pool where callers wait for a connection. Every Redis implementation of a store is
``store_edge``: what its public methods raise is ``StoreError`` (``StoreUnavailable`` when Redis
did not answer or refused this client), with redis-py's error as its ``__cause__``. redis-py is
imported only when a client is made or an error translated, so a process without a Redis URL (the
embedded engine) never loads it.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from .._errors import StoreError, StoreUnavailable
from .._refusals import refusal

if TYPE_CHECKING:
    import redis

COMMAND_TIMEOUT_SECS = 10.0
"""How long a command's reply may take before its connection counts as lost."""
BLOCKING_TIMEOUT_SECS = 30.0
"""For a client whose commands block (BLMPOP): longer than any block."""
CONNECT_TIMEOUT_SECS = 5.0
HEALTH_CHECK_SECS = 10
"""A connection idle this long is PINGed before it is used again (a dead one is made again)."""
POOL_SIZE = 16
"""Connections one client holds at most: past it, a caller waits for one to come back
(redis-py's own pool would fail with "Too many connections")."""
POOL_WAIT_SECS = 10.0


def redis_client(url: str, *, timeout_secs: float = COMMAND_TIMEOUT_SECS) -> redis.Redis:
    """A client of ``url``: ``timeout_secs`` for each reply (and at most that to connect), TCP
    keepalive, health checks, one retry of a command whose connection broke or timed out, and a
    pool of its own of ``POOL_SIZE`` where callers wait. It connects on first use (in a forked
    child, anew); ``close()`` closes its connections."""
    import redis

    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=POOL_SIZE,
        timeout=POOL_WAIT_SECS,
        socket_timeout=timeout_secs,
        socket_connect_timeout=min(CONNECT_TIMEOUT_SECS, timeout_secs),
        socket_keepalive=True,
        health_check_interval=HEALTH_CHECK_SECS,
        retry_on_timeout=True,
    )
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # the pool is the client's own: close() closes it
    return client


class ClientOnFirstUse:
    """``redis_client(url)``, made when first asked for: a store made at import (a tools module's
    memory) loads no redis-py, and one made before a fork connects in the child."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()

    def get(self) -> redis.Redis:
        with self._lock:
            if self._client is None:
                self._client = redis_client(self.url)
            return self._client


def unreachable() -> tuple[type[Exception], ...]:
    """redis-py's errors for Redis not answering, which the store's own quick retries catch."""
    import redis

    return (redis.ConnectionError, redis.TimeoutError)


def store_error(exc: BaseException) -> StoreError | None:
    """criogenai's error for one of redis-py's (a refusal says so), None for any other exception."""
    import redis

    if isinstance(exc, unreachable()):
        return StoreUnavailable(refusal(exc) or f"Redis did not answer ({type(exc).__name__}: {exc})")
    if isinstance(exc, redis.RedisError):
        return StoreError(f"Redis failed a command ({type(exc).__name__}: {exc})")
    return None


P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)


def _translated(method: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            ours = store_error(exc)
            if ours is None:
                raise
            raise ours from exc

    return call


def store_edge(cls: C) -> C:
    """Make every public method of ``cls`` (a store's Redis implementation) raise ``StoreError``
    instead of redis-py's errors."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, _translated(member))
    return cls
