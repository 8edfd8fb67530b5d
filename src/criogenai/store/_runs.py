"""Where agent runs are kept: each run's state and its messages in order, as raw JSON, in Redis
(kept ``retention_secs`` from the last write) or in this process (the latest ``MEMORY_RUNS``).

What a run and its messages are is the agent's (``agent/_runs``). An append names the position it
writes, so two processes continuing one run cannot interleave messages.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from .._keys import Keys
from ._redis import ClientOnFirstUse, store_edge

if TYPE_CHECKING:
    import redis

MEMORY_RUNS = 1000
"""The embedded store keeps this many runs, dropping the least recently written."""


class RunStore(Protocol):
    def create(self, run_id: str, state: str) -> bool:
        """Store a new run's state; False if the id is taken."""
        ...

    def state(self, run_id: str) -> str | None: ...
    def set_state(self, run_id: str, state: str) -> None: ...
    def append(self, run_id: str, seq: int, entry: str) -> bool:
        """Store ``entry`` at position ``seq``; False if that is not the end of the run's messages
        (another process wrote there first), or the run is not stored."""
        ...

    def entries(self, run_id: str) -> list[str]: ...


# KEYS: messages list, state key. ARGV: expected length, entry JSON, TTL seconds.
_APPEND = """
if redis.call('LLEN', KEYS[1]) ~= tonumber(ARGV[1]) then return -1 end
local n = redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return n
"""


@store_edge
class RedisRunStore:
    """Runs in Redis: ``Keys.run_messages`` (list) and ``Keys.run_state`` (string) of each."""

    def __init__(self, url: str, *, prefix: str = "crg", retention_secs: int) -> None:
        self.url, self.keys, self.retention_secs = url, Keys(prefix), retention_secs
        self._client = ClientOnFirstUse(url)

    @property
    def client(self) -> redis.Redis:
        return self._client.get()

    def create(self, run_id: str, state: str) -> bool:
        return bool(self.client.set(self.keys.run_state(run_id), state, nx=True, ex=self.retention_secs))

    def state(self, run_id: str) -> str | None:
        raw = self.client.get(self.keys.run_state(run_id))
        return raw.decode() if isinstance(raw, bytes) else None

    def set_state(self, run_id: str, state: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.keys.run_state(run_id), state, ex=self.retention_secs)
        pipe.expire(self.keys.run_messages(run_id), self.retention_secs)
        pipe.execute()

    def append(self, run_id: str, seq: int, entry: str) -> bool:
        keys = [self.keys.run_messages(run_id), self.keys.run_state(run_id)]
        return int(self.client.eval(_APPEND, 2, *keys, seq, entry, self.retention_secs)) >= 0

    def entries(self, run_id: str) -> list[str]:
        raw: list[bytes] = self.client.lrange(self.keys.run_messages(run_id), 0, -1)  # type: ignore[assignment]
        return [r.decode() for r in raw]


class MemoryRunStore:
    """Runs in this process (the embedded engine): the latest ``MEMORY_RUNS`` runs are kept."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, tuple[str, list[str]]] = OrderedDict()
        self._lock = threading.Lock()

    def create(self, run_id: str, state: str) -> bool:
        with self._lock:
            if run_id in self._runs:
                return False
            self._runs[run_id] = (state, [])
            while len(self._runs) > MEMORY_RUNS:
                self._runs.popitem(last=False)
            return True

    def state(self, run_id: str) -> str | None:
        with self._lock:
            found = self._runs.get(run_id)
            return found[0] if found else None

    def set_state(self, run_id: str, state: str) -> None:
        with self._lock:
            _, entries = self._runs.get(run_id, (state, []))
            self._runs[run_id] = (state, entries)
            self._runs.move_to_end(run_id)

    def append(self, run_id: str, seq: int, entry: str) -> bool:
        with self._lock:
            found = self._runs.get(run_id)
            if found is None or len(found[1]) != seq:
                return False
            found[1].append(entry)
            self._runs.move_to_end(run_id)
            return True

    def entries(self, run_id: str) -> list[str]:
        with self._lock:
            found = self._runs.get(run_id)
            return list(found[1]) if found else []
