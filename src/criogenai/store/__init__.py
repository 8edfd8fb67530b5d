"""What the engine keeps, below both sides: the ledger (claims, results, leases, reply lists),
the fleet-wide limit gates and the tool catalog, each in Redis or in memory, and the one place
a ledger is made from the settings. It imports neither the dispatcher, nor the worker, nor the
runner, and no Celery."""

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
from ._connect import MIN_REDIS, check_server, make_ledger, redis_version_ok
from ._ledger import HEARTBEAT_TTL_SECS, UNREACHABLE, Claim, Ledger, MemoryLedger, RedisLedger
from ._limits import Gate, Limiter, MemoryLimiter, RedisLimiter

__all__ = [
    "CATALOG_TTL_SECS",
    "HEARTBEAT_TTL_SECS",
    "MIN_REDIS",
    "UNREACHABLE",
    "Catalog",
    "CatalogEntry",
    "CatalogPublisher",
    "Claim",
    "Described",
    "Gate",
    "Ledger",
    "Limiter",
    "MemoryLedger",
    "MemoryLimiter",
    "RedisLedger",
    "RedisLimiter",
    "check_server",
    "describe_conflict",
    "make_ledger",
    "redis_version_ok",
    "signing_mismatch",
    "versions",
]
