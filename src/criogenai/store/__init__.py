"""What the engine keeps, below both sides: the ledger (claims, results, leases, reply lists),
the fleet-wide limit gates, the tool catalog, approval records, agent run records, the result
cache and the memory tools' memories, each in Redis or in memory, chosen from the settings in one
place (``_connect``); the one Redis connection factory, and redis-py's errors turned into
``StoreError`` where they leave a store (``_redis``). It imports neither the dispatcher, nor the
worker, nor the runner, and no Celery; redis-py only when a Redis store is made."""

from ._approvals import ApprovalStore, MemoryApprovalStore, RedisApprovalStore
from ._cache import CacheStore, MemoryCacheStore, RedisCacheStore
from ._catalog import (
    CATALOG_TTL_SECS,
    Catalog,
    CatalogEntry,
    CatalogPublisher,
    Described,
    describe_conflict,
    signing_mismatch,
    versions,
)
from ._connect import (
    MIN_REDIS,
    check_server,
    ledger_catalog,
    make_approval_store,
    make_cache_store,
    make_ledger,
    make_limiter,
    make_memory_store,
    make_run_store,
    redis_version_ok,
)
from ._ledger import HEARTBEAT_TTL_SECS, Claim, Ledger, MemoryLedger, RedisLedger
from ._limits import Gate, Limiter, MemoryLimiter, RedisLimiter
from ._memories import LocalMemoryStore, MemoryRecord, MemoryStore, RedisMemoryStore
from ._redis import redis_client
from ._runs import MemoryRunStore, RedisRunStore, RunStore

__all__ = [
    "CATALOG_TTL_SECS",
    "HEARTBEAT_TTL_SECS",
    "MIN_REDIS",
    "ApprovalStore",
    "CacheStore",
    "Catalog",
    "CatalogEntry",
    "CatalogPublisher",
    "Claim",
    "Described",
    "Gate",
    "Ledger",
    "Limiter",
    "LocalMemoryStore",
    "MemoryApprovalStore",
    "MemoryCacheStore",
    "MemoryLedger",
    "MemoryLimiter",
    "MemoryRecord",
    "MemoryRunStore",
    "MemoryStore",
    "RedisApprovalStore",
    "RedisCacheStore",
    "RedisLedger",
    "RedisLimiter",
    "RedisMemoryStore",
    "RedisRunStore",
    "RunStore",
    "check_server",
    "describe_conflict",
    "ledger_catalog",
    "make_approval_store",
    "make_cache_store",
    "make_ledger",
    "make_limiter",
    "make_memory_store",
    "make_run_store",
    "redis_client",
    "redis_version_ok",
    "signing_mismatch",
    "versions",
]
