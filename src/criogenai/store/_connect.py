"""The one place each store is chosen from the settings: Redis with a Redis URL (a fleet), this
process's memory without one (the embedded engine); and the check that the Redis a fleet talks
to is one criogenai runs on."""

from __future__ import annotations

from .._config import Settings
from .._errors import ConfigurationError, StoreError, StoreUnavailable
from .._refusals import refusal
from ._approvals import ApprovalStore, MemoryApprovalStore, RedisApprovalStore
from ._cache import CacheStore, MemoryCacheStore, RedisCacheStore
from ._catalog import Catalog
from ._ledger import Ledger, MemoryLedger, RedisLedger
from ._limits import Limiter, MemoryLimiter, RedisLimiter
from ._memories import LocalMemoryStore, MemoryStore, RedisMemoryStore
from ._runs import MemoryRunStore, RedisRunStore, RunStore


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


def make_limiter(ledger: Ledger, lease_secs: float) -> Limiter:
    """The fleet-wide gates beside the ledger: in its Redis, else in this process."""
    if isinstance(ledger, RedisLedger):
        return RedisLimiter(ledger.client, ledger.keys, lease_secs)
    return MemoryLimiter(lease_secs)


def ledger_catalog(ledger: Ledger) -> Catalog | None:
    """The tool catalog in the ledger's Redis; None embedded (there is no fleet to describe)."""
    if isinstance(ledger, RedisLedger):
        return Catalog(ledger.client, prefix=ledger.keys.prefix, heartbeat_ttl_secs=ledger.heartbeat_ttl_secs)
    return None


_MEMORY_APPROVALS = MemoryApprovalStore()
"""The embedded engine's approvals, shared in the process so ``Approvals()`` sees what a
Dispatcher asked."""


def make_approval_store(settings: Settings) -> ApprovalStore:
    if settings.redis_url:
        return RedisApprovalStore(
            settings.redis_url, prefix=settings.key_prefix, retention_secs=settings.retention_secs
        )
    return _MEMORY_APPROVALS


def make_run_store(settings: Settings) -> RunStore:
    if settings.redis_url:
        return RedisRunStore(
            settings.redis_url, prefix=settings.key_prefix, retention_secs=settings.retention_secs
        )
    return MemoryRunStore()


def make_cache_store(settings: Settings) -> CacheStore:
    """A result cache's entries: in Redis, shared by the fleet's dispatchers, else its own."""
    if settings.redis_url:
        return RedisCacheStore(settings.redis_url, prefix=settings.key_prefix)
    return MemoryCacheStore()


def make_memory_store(settings: Settings) -> MemoryStore:
    """The memory tools' store: the fleet's Redis (workers and agent alike), else this process's."""
    if settings.redis_url:
        return RedisMemoryStore(settings.redis_url, prefix=settings.key_prefix)
    return LocalMemoryStore()


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
        version = ledger.server_version()
    except StoreUnavailable as exc:
        why = refusal(exc, fresh=True)
        if login and why is not None:
            raise ConfigurationError(why) from None
        return
    except StoreError:  # INFO not allowed for this user: nothing to check against
        return
    if version and not redis_version_ok(version):
        raise ConfigurationError(
            f"criogenai needs Redis 7.0 or newer (it pops with BLMPOP); the server runs {version}"
        )
