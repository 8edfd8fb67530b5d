"""Where the result cache keeps its entries: one text per (tool, schema hash, arguments digest),
each for a TTL, in Redis (shared by the dispatchers of a fleet) or in one cache's memory.

Which calls are cached and what an entry holds is the cache hook's (``dispatcher/_hooks``).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from .._keys import Keys
from ._redis import redis_client, store_edge


class CacheStore(Protocol):
    def get(self, tool: str, schema_hash: str, digest: str) -> str | None:
        """The entry, while its TTL lasts."""
        ...

    def put(self, tool: str, schema_hash: str, digest: str, value: str, ttl_secs: float) -> None: ...


@store_edge
class RedisCacheStore:
    """Entries as strings with a TTL (``Keys.cached``)."""

    def __init__(self, url: str, *, prefix: str = "crg") -> None:
        self.keys = Keys(prefix)
        self.client = redis_client(url)

    def get(self, tool: str, schema_hash: str, digest: str) -> str | None:
        raw = self.client.get(self.keys.cached(tool, schema_hash, digest))
        return raw.decode() if isinstance(raw, bytes) else None

    def put(self, tool: str, schema_hash: str, digest: str, value: str, ttl_secs: float) -> None:
        self.client.set(self.keys.cached(tool, schema_hash, digest), value, px=max(1, int(ttl_secs * 1000)))


MEMORY_MAX_ENTRIES = 10_000
"""The most entries one in-memory cache keeps; past it, those closest to expiring go first."""


class MemoryCacheStore:
    """Entries in this process, for one cache (the embedded engine). Expired entries are swept
    whenever the cache has doubled since the last sweep, so it stays bounded by what is live."""

    def __init__(self, max_entries: int = MEMORY_MAX_ENTRIES) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str], tuple[float, str]] = {}
        self._max = max_entries
        self._sweep_at = 256

    def get(self, tool: str, schema_hash: str, digest: str) -> str | None:
        with self._lock:
            found = self._entries.get((tool, schema_hash, digest))
            return found[1] if found and found[0] > time.monotonic() else None

    def put(self, tool: str, schema_hash: str, digest: str, value: str, ttl_secs: float) -> None:
        now = time.monotonic()
        with self._lock:
            self._entries[(tool, schema_hash, digest)] = (now + ttl_secs, value)
            if len(self._entries) >= self._sweep_at:
                self._sweep(now)

    def __len__(self) -> int:
        return len(self._entries)

    def _sweep(self, now: float) -> None:
        """Drop expired entries, then the soonest to expire past the cap (under the lock)."""
        live = {k: v for k, v in self._entries.items() if v[0] > now}
        if len(live) > self._max:
            kept = sorted(live.items(), key=lambda item: item[1][0])[len(live) - self._max:]
            live = dict(kept)
        self._entries = live
        self._sweep_at = max(256, 2 * len(live))
