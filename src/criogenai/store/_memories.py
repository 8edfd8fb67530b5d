"""Where the memory tools' memories live: a fleet's Redis (every worker reaches it), or this
process (memory or a SQLite file). The tools themselves are ``criogenai.memory``'s.

Every operation names its namespace and scope; a store has no call that reads across scopes, so a
tool can only reach the scope its call carries. Counts are capped per scope atomically (a Lua
script on Redis, a transaction in SQLite, a lock in memory).
"""

from __future__ import annotations

import sqlite3
import threading
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict

from .._keys import Keys
from ._redis import ClientOnFirstUse, store_edge

if TYPE_CHECKING:
    import redis

DEFAULT_RETENTION_SECS = 90 * 24 * 3600


class MemoryRecord(BaseModel):
    """One memory: its id, text, when it was made (Unix time) and, with an embedder, its vector."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    text: str
    created: float
    vector: list[float] | None = None


class MemoryStore(Protocol):
    def add(self, namespace: str, scope: str, record: MemoryRecord, max_count: int) -> bool:
        """Store ``record`` (replacing one with its id); False when the scope already holds
        ``max_count`` other memories."""
        ...

    def delete(self, namespace: str, scope: str, memory_id: str) -> bool:
        """Forget one memory of the scope; False when the scope has none with that id."""
        ...

    def all(self, namespace: str, scope: str) -> list[MemoryRecord]:
        """Every memory of the scope, oldest first."""
        ...


# KEYS: the scope's hash. ARGV: id, record JSON, max count, TTL seconds.
_ADD = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


@store_edge
class RedisMemoryStore:
    """Memories in Redis, one hash per scope (``Keys.memories``), kept ``retention_secs`` after the
    scope's last remember or forget."""

    def __init__(
        self, url: str, *, prefix: str = "crg", retention_secs: int = DEFAULT_RETENTION_SECS
    ) -> None:
        if retention_secs < 60:
            raise ValueError("retention_secs must be at least 60")
        self.url, self.keys, self.retention_secs = url, Keys(prefix), retention_secs
        self._client = ClientOnFirstUse(url)

    def __repr__(self) -> str:
        return f"<RedisMemoryStore prefix={self.keys.prefix!r} retention_secs={self.retention_secs}>"

    @property
    def client(self) -> redis.Redis:
        return self._client.get()

    def add(self, namespace: str, scope: str, record: MemoryRecord, max_count: int) -> bool:
        key = self.keys.memories(namespace, scope)
        body = record.model_dump_json()
        return bool(self.client.eval(_ADD, 1, key, record.id, body, max_count, self.retention_secs))

    def delete(self, namespace: str, scope: str, memory_id: str) -> bool:
        key = self.keys.memories(namespace, scope)
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(key, memory_id)
        pipe.expire(key, self.retention_secs)
        removed, _ = pipe.execute()
        return bool(removed)

    def all(self, namespace: str, scope: str) -> list[MemoryRecord]:
        raw = self.client.hvals(self.keys.memories(namespace, scope))
        return sorted((MemoryRecord.model_validate_json(r) for r in raw), key=lambda r: (r.created, r.id))


class LocalMemoryStore:
    """Memories in this process: in memory, or in a SQLite file when ``path`` is given (they then
    outlive the process). For the embedded engine; workers on other hosts cannot reach it."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path or ":memory:", check_same_thread=False, isolation_level=None)
        with self._lock:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS criogenai_memories ("
                " namespace TEXT NOT NULL, scope TEXT NOT NULL, id TEXT NOT NULL,"
                " record TEXT NOT NULL, created REAL NOT NULL,"
                " PRIMARY KEY (namespace, scope, id))"
            )

    def __repr__(self) -> str:
        return f"<LocalMemoryStore {self.path or ':memory:'}>"

    def add(self, namespace: str, scope: str, record: MemoryRecord, max_count: int) -> bool:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                exists = self._db.execute(
                    "SELECT 1 FROM criogenai_memories WHERE namespace = ? AND scope = ? AND id = ?",
                    (namespace, scope, record.id),
                ).fetchone()
                (count,) = self._db.execute(
                    "SELECT count(*) FROM criogenai_memories WHERE namespace = ? AND scope = ?",
                    (namespace, scope),
                ).fetchone()
                if not exists and count >= max_count:
                    self._db.execute("ROLLBACK")
                    return False
                self._db.execute(
                    "INSERT OR REPLACE INTO criogenai_memories VALUES (?, ?, ?, ?, ?)",
                    (namespace, scope, record.id, record.model_dump_json(), record.created),
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return True

    def delete(self, namespace: str, scope: str, memory_id: str) -> bool:
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM criogenai_memories WHERE namespace = ? AND scope = ? AND id = ?",
                (namespace, scope, memory_id),
            )
            return cur.rowcount > 0

    def all(self, namespace: str, scope: str) -> list[MemoryRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT record FROM criogenai_memories WHERE namespace = ? AND scope = ?"
                " ORDER BY created, id",
                (namespace, scope),
            ).fetchall()
        return [MemoryRecord.model_validate_json(r) for (r,) in rows]
