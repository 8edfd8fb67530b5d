"""The tool catalog: what each live worker serves, published to Redis with its heartbeat.

A worker's heartbeat writes one record per tool it serves (its ``ToolDefinition``: name,
description, JSON Schema, flags, queue, schema hash) under that tool's hash in Redis, at its first
beat and every half minute after; a record counts while it is fresh and its worker still beats on
the tool's queue (the worker sets the dispatchers watch). An agent process reads the definitions
back to build tools that validate calls exactly as the workers would, without importing the tools'
code, and to notice when two live workers serve one name with different definitions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from pydantic import Field, ValidationError

from .._config import Settings
from .._errors import ConfigurationError
from .._keys import Keys
from .._wire import ToolDefinition
from ._ledger import HEARTBEAT_TTL_SECS
from ._redis import redis_client, store_edge

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)

REFRESH_SECS = 30.0
"""How often a worker rewrites its records; its liveness comes from its heartbeat, every few seconds."""
CATALOG_TTL_SECS = 3 * REFRESH_SECS
"""A record not rewritten for this long is stale, whatever its worker's heartbeat says."""
PRUNE_AFTER_SECS = 10 * CATALOG_TTL_SECS
"""Records older than this are deleted by whoever reads them."""


class Described(Protocol):
    """What the catalog records of a tool (``tools.Tool`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def definition(self) -> ToolDefinition: ...


class CatalogEntry(ToolDefinition):
    """One tool as one worker serves it: the tool's definition, the worker, and when it said so.

    On the wire a flat record (the definition's fields, then these), as it was before the
    definition had a model of its own, so dispatchers and workers of either version read it.
    """

    worker: str
    published_at: float
    """Unix time the worker last wrote this record."""
    ttl_secs: float = Field(CATALOG_TTL_SECS, gt=0)
    key_id: str | None = Field(None, exclude_if=lambda v: v is None)
    """The public name of the worker's signing secret (``_signing.key_id``), None without one: a
    dispatcher whose own differs ends its calls at once instead of waiting for them to time out.
    Left out when None, so records stay as they were without a secret."""

    @classmethod
    def of(
        cls,
        t: Described | ToolDefinition,
        worker: str,
        now: float,
        ttl_secs: float = CATALOG_TTL_SECS,
        key_id: str | None = None,
    ) -> CatalogEntry:
        definition = t if isinstance(t, ToolDefinition) else t.definition
        return cls(
            **definition.model_dump(exclude={"v"}),
            worker=worker,
            published_at=now,
            ttl_secs=ttl_secs,
            key_id=key_id,
        )

    @property
    def definition(self) -> ToolDefinition:
        """The tool's definition alone, without who serves it."""
        return ToolDefinition.model_validate(self.model_dump(include=set(ToolDefinition.model_fields)))

    def fresh(self, now: float) -> bool:
        return now - self.published_at < self.ttl_secs


@store_edge
class Catalog:
    """The catalog in Redis: a sorted set of tool names, and one hash per tool (worker → record)
    (``Keys.catalog``, ``Keys.catalog_tool``). Raises ``StoreError`` when Redis fails."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "crg",
        ttl_secs: float = CATALOG_TTL_SECS,
        heartbeat_ttl_secs: float = HEARTBEAT_TTL_SECS,
    ) -> None:
        self.client = client
        self.keys = Keys(prefix)
        self.ttl_secs = ttl_secs
        self.heartbeat_ttl_secs = heartbeat_ttl_secs

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Catalog:
        settings = settings or Settings.from_env()
        if not settings.redis_url:
            raise ConfigurationError(
                "the tool catalog lives in the fleet's Redis: set CRIOGENAI_BROKER_URL=redis://..."
            )
        return cls(
            redis_client(settings.redis_url),
            prefix=settings.key_prefix,
            heartbeat_ttl_secs=settings.heartbeat_ttl_secs,
        )

    # -- the worker's side ------------------------------------------------------------------------

    def publish(
        self,
        worker: str,
        tools: Iterable[Described],
        *,
        now: float | None = None,
        key_id: str | None = None,
    ) -> None:
        """Write (or refresh) this worker's record of each tool."""
        now = time.time() if now is None else now
        keep = int(PRUNE_AFTER_SECS)
        pipe = self.client.pipeline(transaction=False)
        for t in tools:
            entry = CatalogEntry.of(t, worker, now, self.ttl_secs, key_id)
            pipe.hset(self.keys.catalog_tool(t.name), worker, entry.model_dump_json())
            pipe.expire(self.keys.catalog_tool(t.name), keep)
            pipe.zadd(self.keys.catalog(), {t.name: now})
            pipe.expire(self.keys.catalog(), keep)
        pipe.execute()

    def has(self, worker: str, name: str) -> bool:
        """Whether this worker's record of the tool is in Redis."""
        return bool(self.client.hexists(self.keys.catalog_tool(name), worker))

    def withdraw(self, worker: str, names: Iterable[str]) -> None:
        """Remove this worker's records (at a clean shutdown)."""
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hdel(self.keys.catalog_tool(name), worker)
        pipe.execute()

    # -- the agent's side -------------------------------------------------------------------------

    def read(self, names: Sequence[str] | None = None) -> dict[str, list[CatalogEntry]]:
        """Live records by tool name (all tools, or ``names``), each list sorted by worker."""
        now = time.time()
        if names is None:
            raw_names: list[bytes] = self.client.zrangebyscore(  # type: ignore[assignment]
                self.keys.catalog(), now - PRUNE_AFTER_SECS, "+inf"
            )
            names = sorted(n.decode() for n in raw_names)
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self.keys.catalog_tool(name))
        found: dict[str, list[CatalogEntry]] = {}
        stale: list[tuple[str, str]] = []
        for name, fields in zip(names, pipe.execute(), strict=True):
            live: list[CatalogEntry] = []
            for worker_raw, raw in fields.items():
                worker = worker_raw.decode()
                try:
                    entry = CatalogEntry.model_validate_json(raw)
                except ValidationError:
                    log.warning("catalog: record of %r by %s is not a v1 record; ignored", name, worker)
                    continue
                if entry.fresh(now):
                    live.append(entry)
                elif now - entry.published_at > PRUNE_AFTER_SECS:
                    stale.append((name, worker))
            if live:
                found[name] = sorted(live, key=lambda e: e.worker)
        found = self._beating(found, now)
        if stale:
            pipe = self.client.pipeline(transaction=False)
            for name, worker in stale:
                pipe.hdel(self.keys.catalog_tool(name), worker)
            pipe.execute()
        return found

    def _beating(self, found: dict[str, list[CatalogEntry]], now: float) -> dict[str, list[CatalogEntry]]:
        """Keep the records whose worker still beats on the tool's queue."""
        pairs = sorted({(e.queue, e.worker) for es in found.values() for e in es})
        if not pairs:
            return found
        pipe = self.client.pipeline(transaction=False)
        for queue, worker in pairs:
            pipe.zscore(self.keys.workers(queue), worker)
        beats = dict(zip(pairs, pipe.execute(), strict=True))
        out: dict[str, list[CatalogEntry]] = {}
        for name, es in found.items():
            kept = [e for e in es if now - (beats[(e.queue, e.worker)] or 0.0) < self.heartbeat_ttl_secs]
            if kept:
                out[name] = kept
        return out

    def wait_for(self, names: Sequence[str], timeout_secs: float) -> dict[str, list[CatalogEntry]]:
        """Read until every name has a live worker, or ``timeout_secs`` pass (then what there is)."""
        deadline = time.monotonic() + timeout_secs
        while True:
            entries = self.read(names)
            if all(n in entries for n in names) or time.monotonic() >= deadline:
                return entries
            time.sleep(0.2)


def versions(entries: Iterable[CatalogEntry]) -> dict[str, list[str]]:
    """Each distinct definition (schema hash and flags) → the workers serving it."""
    out: dict[str, list[str]] = {}
    for e in entries:
        out.setdefault(e.version, []).append(e.worker)
    return out


def describe_conflict(name: str, entries: Iterable[CatalogEntry]) -> str:
    """One line naming every definition of a tool and the workers behind each."""
    parts = [f"{v} on {', '.join(ws)}" for v, ws in sorted(versions(entries).items())]
    return f"tool {name!r} is served with different schemas: " + "; ".join(parts)


def signing_mismatch(entries: Sequence[CatalogEntry], mine: str | None) -> str | None:
    """Why no live worker in ``entries`` (one tool's records) can serve a dispatcher whose signing
    secret's key id is ``mine``, or None when one can (or there are none to judge by)."""
    theirs = {e.key_id for e in entries}
    if not entries or mine in theirs:
        return None
    if mine is None:
        return "its workers only run signed calls, and this dispatcher has no signing secret"
    if theirs == {None}:
        return ("its workers have no signing secret, so their results could not be told from "
                "forged ones")
    return "its workers have another signing secret (or none)"


class CatalogPublisher:
    """Called by a worker's heartbeat: publishes the tools of the queues it serves, or withdraws them."""

    def __init__(
        self,
        catalog: Catalog,
        registry: Iterable[Described],
        refresh_secs: float = REFRESH_SECS,
        *,
        key_id: str | None = None,
    ) -> None:
        self.catalog = catalog
        self.registry = registry
        self.refresh_secs = refresh_secs
        self.key_id = key_id
        """Published with each record: the key id of the worker's signing secret."""
        self._written: dict[str, float] = {}

    def __call__(self, worker: str, queues: Sequence[str], stop: bool) -> None:
        tools = [t for t in self.registry if t.queue in queues]
        if stop:
            self.catalog.withdraw(worker, [t.name for t in tools])
            self._written.pop(worker, None)
        elif tools and (
            time.monotonic() - self._written.get(worker, -self.refresh_secs) >= self.refresh_secs
            or not self.catalog.has(worker, tools[0].name)  # Redis restarted or was flushed
        ):
            self.catalog.publish(worker, tools, key_id=self.key_id)
            self._written[worker] = time.monotonic()
