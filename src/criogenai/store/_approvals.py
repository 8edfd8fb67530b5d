"""Where approval records are kept: raw JSON by (run id, call id), in Redis or in this process.

What a record means and how a decision is taken is the dispatcher's (``dispatcher/_approvals``);
this keeps the text, for the retention, and gives the one atomic step every decision takes
(``swap``: compare and set), so two people can never both win.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Protocol

from .._keys import Keys
from ._redis import redis_client, store_edge


class ApprovalStore(Protocol):
    """Raw JSON records by (run id, call id); ``swap`` is the one atomic step every decision takes."""

    def get(self, run_id: str, call_ids: list[str]) -> dict[str, str]: ...
    def add(self, run_id: str, call_id: str, raw: str, when: float) -> str:
        """Store ``raw`` unless a record exists; return the record that stands."""
        ...

    def swap(self, run_id: str, call_id: str, old: str, new: str) -> bool:
        """Replace the record by ``new`` only if it is still exactly ``old``."""
        ...

    def runs(self) -> list[str]: ...
    def all(self, run_id: str) -> dict[str, str]: ...


_ADD = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  return ARGV[2]
end
return redis.call('HGET', KEYS[1], ARGV[1])
"""

_SWAP = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


@store_edge
class RedisApprovalStore:
    """Records in one hash per run (``Keys.approvals``), plus an index of runs to list
    (``Keys.approval_runs``)."""

    def __init__(self, url: str, *, prefix: str = "crg", retention_secs: int = 7 * 24 * 3600) -> None:
        self.keys = Keys(prefix)
        self.retention_secs = retention_secs
        self.client = redis_client(url)
        self._add = self.client.register_script(_ADD)
        self._swap = self.client.register_script(_SWAP)

    def get(self, run_id: str, call_ids: list[str]) -> dict[str, str]:
        if not call_ids:
            return {}
        raw: list[bytes | None] = self.client.hmget(self.keys.approvals(run_id), call_ids)  # type: ignore[assignment]
        return {c: v.decode() for c, v in zip(call_ids, raw, strict=True) if v is not None}

    def add(self, run_id: str, call_id: str, raw: str, when: float) -> str:
        standing = self._add(keys=[self.keys.approvals(run_id)], args=[call_id, raw, self.retention_secs])
        # The index only helps listing across runs; it lives in another slot, so it is not in the script.
        index = self.keys.approval_runs()
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(index, {run_id: when})
        pipe.zremrangebyscore(index, "-inf", time.time() - self.retention_secs)
        pipe.expire(index, self.retention_secs)
        pipe.execute()
        return standing.decode() if isinstance(standing, bytes) else str(standing)

    def swap(self, run_id: str, call_id: str, old: str, new: str) -> bool:
        return bool(
            self._swap(keys=[self.keys.approvals(run_id)], args=[call_id, old, new, self.retention_secs])
        )

    def runs(self) -> list[str]:
        since = time.time() - self.retention_secs
        names: list[bytes] = self.client.zrangebyscore(self.keys.approval_runs(), since, "+inf")  # type: ignore[assignment]
        return [n.decode() for n in names]

    def all(self, run_id: str) -> dict[str, str]:
        raw: dict[bytes, bytes] = self.client.hgetall(self.keys.approvals(run_id))  # type: ignore[assignment]
        return {k.decode(): v.decode() for k, v in raw.items()}


class MemoryApprovalStore:
    """The same records in this process's memory, for the embedded engine; lost when it exits."""

    def __init__(self, *, retention_secs: int = 7 * 24 * 3600) -> None:
        self.retention_secs = retention_secs
        self._lock = threading.Lock()
        self._runs: dict[str, dict[str, str]] = defaultdict(dict)
        self._expires: dict[str, float] = {}

    def _prune(self) -> None:
        now = time.monotonic()
        for run_id in [r for r, t in self._expires.items() if t < now]:
            self._runs.pop(run_id, None)
            self._expires.pop(run_id, None)

    def get(self, run_id: str, call_ids: list[str]) -> dict[str, str]:
        with self._lock:
            self._prune()
            run = self._runs.get(run_id, {})
            return {c: run[c] for c in call_ids if c in run}

    def add(self, run_id: str, call_id: str, raw: str, when: float) -> str:
        with self._lock:
            self._prune()
            self._expires[run_id] = time.monotonic() + self.retention_secs
            return self._runs[run_id].setdefault(call_id, raw)

    def swap(self, run_id: str, call_id: str, old: str, new: str) -> bool:
        with self._lock:
            self._prune()
            run = self._runs.get(run_id, {})
            if run.get(call_id) != old:
                return False
            run[call_id] = new
            self._expires[run_id] = time.monotonic() + self.retention_secs
            return True

    def runs(self) -> list[str]:
        with self._lock:
            self._prune()
            return list(self._runs)

    def all(self, run_id: str) -> dict[str, str]:
        with self._lock:
            self._prune()
            return dict(self._runs.get(run_id, {}))
