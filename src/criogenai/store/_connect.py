"""A ledger from the settings (Redis with a URL, memory without), and the check that the Redis
it talks to is one criogenai runs on."""

from __future__ import annotations

import redis

from .._config import Settings
from .._errors import ConfigurationError
from .._refusals import refusal
from ._ledger import Ledger, MemoryLedger, RedisLedger


def make_ledger(settings: Settings) -> Ledger:
    if settings.redis_url:
        return RedisLedger(
            settings.redis_url,
            prefix=settings.key_prefix,
            lease_secs=settings.lease_secs,
            retention_secs=settings.retention_secs,
            heartbeat_ttl_secs=settings.heartbeat_ttl_secs,
            celery_records=settings.celery_result_records,
            celery_results=settings.redis_url == settings.result_backend,
            broker_acks=settings.redis_url == settings.broker_url,
        )
    return MemoryLedger(lease_secs=settings.lease_secs, heartbeat_ttl_secs=settings.heartbeat_ttl_secs)


MIN_REDIS = (7, 0)
"""BLMPOP, which workers and dispatchers pop with, came with Redis 7.0."""


def redis_version_ok(version: str) -> bool:
    """Whether a server's ``redis_version`` is one criogenai runs on."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= MIN_REDIS


def check_server(ledger: Ledger, *, login: bool = True) -> None:
    """Fail fast when Redis is older than 7.0 (every pop would fail) and, with ``login``, when it
    refuses the URL's credentials or certificate (a dispatcher instead ends its calls with the
    reason). Redis not up yet is left to the retries; a later refusal stops the worker then
    (``_credentials``)."""
    if not isinstance(ledger, RedisLedger):
        return
    try:
        ledger.client.ping()
        version = str(ledger.client.info("server").get("redis_version", ""))
    except redis.ConnectionError as exc:
        why = refusal(exc, fresh=True)
        if login and why is not None:
            raise ConfigurationError(why) from None
        return
    except redis.RedisError:  # INFO not allowed for this user: nothing to check against
        return
    if version and not redis_version_ok(version):
        raise ConfigurationError(
            f"criogenai needs Redis 7.0 or newer (it pops with BLMPOP); the server runs {version}"
        )
