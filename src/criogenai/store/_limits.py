"""Fleet-wide gates kept in Redis: a call takes a place in each of its gates before it is
published. A concurrency gate's place is given back when the call's result comes in; a rate
gate's place lasts its window from the moment the call was let in (so "at most N calls per
second" counts calls published, which start a queue wait later).

Why the gate is on the dispatcher side: a call waiting for a place waits in its dispatcher, not
in a worker slot, so workers stay free for other tools and tenants (a gate in the worker would
hold the very slots the limit is there to protect, and Celery's ``rate_limit`` is per worker
anyway). Concurrency places are leases: the dispatcher renews the ones it holds, so a dead dispatcher's places
come back within a lease; a dead worker's call keeps its place while the dispatcher sends it
again, because it is still in flight. Waiters are queued in Redis by ticket, so calls over a
limit start in the order they arrived, across every dispatcher. Each step is one Lua script on
server time (no clock of any host matters).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .._keys import Keys
from ._redis import store_edge

if TYPE_CHECKING:
    import redis


class Gate(NamedTuple):
    """One fleet-wide limit a call takes a place in before it is published."""

    name: str
    """``tool:<name>``, ``tenant:<name>``; ``rate:tool:<name>``, ``rate:tenant:<name>``."""
    limit: int
    window_secs: float = 0.0
    """0: a concurrency gate, whose place is held while the call is in flight (renewed, given back
    when it ends). Above 0: a rate gate, whose place is held for this long from the call's start
    whatever the call does, so that at most ``limit`` calls start in any such window."""

    @property
    def is_rate(self) -> bool:
        return self.window_secs > 0


WAITER_TTL_SECS = 5.0
"""A waiter its dispatcher stopped asking for (it died) leaves the queue after this long."""


class Limiter(Protocol):
    lease_secs: float
    """How long a concurrency place lasts unless renewed (renew every third of it)."""

    def admit(self, gates: Sequence[Gate], members: list[str]) -> int:
        """Take a place in every gate for as many of ``members`` as fit, in order; how many did.

        Those that did not fit are queued (or stay queued) behind earlier waiters of the fleet.
        """
        ...

    def renew(self, gates: Sequence[Gate], members: list[str]) -> None:
        """Extend the leases of places held."""
        ...

    def release(self, gates: Sequence[Gate], members: list[str]) -> None:
        """Give back places held and leave the queues. Idempotent."""
        ...


# KEYS: the ticket counter, then hold, wait, alive of each gate.
# ARGV: lease ms, waiter ttl ms, number of gates, each gate's limit and hold ms (0: the lease),
# then the members in order.
# Returns how many of the members (the first n) now hold a place in every gate.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease, ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local first = 4 + 2 * n
local keep = math.max(lease, ttl)
local holds = {}
for g = 0, n - 1 do
  local h = tonumber(ARGV[5 + 2 * g])
  if h <= 0 then h = lease end
  holds[g] = h
  keep = math.max(keep, h)
end
for g = 0, n - 1 do
  local hold, wait, alive = KEYS[2 + 3 * g], KEYS[3 + 3 * g], KEYS[4 + 3 * g]
  redis.call('ZREMRANGEBYSCORE', hold, '-inf', now)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now)) do
    redis.call('ZREM', wait, m)
  end
  redis.call('ZREMRANGEBYSCORE', alive, '-inf', now)
end
for i = first, #ARGV do
  local m, ticket = ARGV[i], nil
  for g = 0, n - 1 do
    local hold, wait, alive = KEYS[2 + 3 * g], KEYS[3 + 3 * g], KEYS[4 + 3 * g]
    if not redis.call('ZSCORE', hold, m) then
      if not redis.call('ZSCORE', wait, m) then
        ticket = ticket or redis.call('INCR', KEYS[1])
        redis.call('ZADD', wait, ticket, m)
      end
      redis.call('ZADD', alive, now + ttl, m)
    end
  end
end
local admitted = 0
for i = first, #ARGV do
  local m, fits = ARGV[i], true
  for g = 0, n - 1 do
    local hold, wait = KEYS[2 + 3 * g], KEYS[3 + 3 * g]
    if not redis.call('ZSCORE', hold, m) then
      local rank = redis.call('ZRANK', wait, m)
      if not rank or rank >= tonumber(ARGV[4 + 2 * g]) - redis.call('ZCARD', hold) then
        fits = false
        break
      end
    end
  end
  if not fits then break end
  for g = 0, n - 1 do
    local hold, wait, alive = KEYS[2 + 3 * g], KEYS[3 + 3 * g], KEYS[4 + 3 * g]
    redis.call('ZREM', wait, m)
    redis.call('ZREM', alive, m)
    redis.call('ZADD', hold, now + holds[g], m)
  end
  admitted = admitted + 1
end
for k = 2, #KEYS do redis.call('PEXPIRE', KEYS[k], 2 * keep) end
redis.call('EXPIRE', KEYS[1], 86400)
return admitted
"""

# KEYS: one gate's hold. ARGV: lease ms, members. Extends only places still held.
_RENEW = """
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[1]) + 10000)
return 1
"""


@store_edge
class RedisLimiter:
    """The gates on Redis, shared by every dispatcher of the fleet."""

    def __init__(self, client: redis.Redis, keys: Keys, lease_secs: float) -> None:
        self._client = client
        self._keys = keys
        self.lease_secs = lease_secs
        self._admit = client.register_script(_ADMIT)
        self._renew = client.register_script(_RENEW)

    def _gate_keys(
        self, gates: Sequence[Gate], parts: Sequence[str] = ("hold", "wait", "alive"),
    ) -> list[str]:
        return [self._keys.limit(g.name, part) for g in gates for part in parts]

    def admit(self, gates: Sequence[Gate], members: list[str]) -> int:
        if not members:
            return 0
        keys = [self._keys.limit("ticket", "n"), *self._gate_keys(gates)]
        args: list[str | int] = [
            int(self.lease_secs * 1000),
            int(WAITER_TTL_SECS * 1000),
            len(gates),
            *(x for g in gates for x in (g.limit, int(g.window_secs * 1000))),
            *members,
        ]
        return int(self._admit(keys=keys, args=args))

    def renew(self, gates: Sequence[Gate], members: list[str]) -> None:
        if not members:
            return
        pipe = self._client.pipeline(transaction=False)
        for g in gates:
            if g.is_rate:  # a rate gate's place lasts its window, however long the call runs
                continue
            self._renew(
                keys=[self._keys.limit(g.name, "hold")],
                args=[int(self.lease_secs * 1000), *members],
                client=pipe,
            )
        pipe.execute()

    def release(self, gates: Sequence[Gate], members: list[str]) -> None:
        if not members:
            return
        pipe = self._client.pipeline(transaction=False)
        for g in gates:
            parts = ("wait", "alive") if g.is_rate else ("hold", "wait", "alive")
            for key in self._gate_keys([g], parts):
                pipe.zrem(key, *members)
        pipe.execute()


class MemoryLimiter:
    """The same gates in one process's memory, for the embedded engine."""

    def __init__(self, lease_secs: float) -> None:
        self.lease_secs = lease_secs
        self._lock = threading.Lock()
        self._hold: dict[str, dict[str, float]] = {}
        self._wait: dict[str, dict[str, tuple[int, float]]] = {}
        self._ticket = 0

    def admit(self, gates: Sequence[Gate], members: list[str]) -> int:
        now = time.monotonic()
        with self._lock:
            for g in gates:
                hold = self._hold.setdefault(g.name, {})
                wait = self._wait.setdefault(g.name, {})
                for m in [m for m, until in hold.items() if until <= now]:
                    del hold[m]
                for m in [m for m, (_, alive) in wait.items() if alive <= now]:
                    del wait[m]
            for m in members:
                self._queue(gates, m, now)
            admitted = 0
            for m in members:
                if not self._fits(gates, m):
                    break
                for g in gates:
                    self._wait[g.name].pop(m, None)
                    self._hold[g.name][m] = now + (g.window_secs if g.is_rate else self.lease_secs)
                admitted += 1
            return admitted

    def _queue(self, gates: Sequence[Gate], m: str, now: float) -> None:
        ticket: int | None = None
        for g in gates:
            name = g.name
            if m in self._hold[name]:
                continue
            old = self._wait[name].get(m)
            if old is None:
                if ticket is None:
                    self._ticket += 1
                    ticket = self._ticket
                old = (ticket, 0.0)
            self._wait[name][m] = (old[0], now + WAITER_TTL_SECS)

    def _fits(self, gates: Sequence[Gate], m: str) -> bool:
        for name, limit, _ in gates:
            if m in self._hold[name]:
                continue
            rank = sorted(self._wait[name].values()).index(self._wait[name][m])
            if rank >= limit - len(self._hold[name]):
                return False
        return True

    def renew(self, gates: Sequence[Gate], members: list[str]) -> None:
        until = time.monotonic() + self.lease_secs
        with self._lock:
            for g in gates:
                if g.is_rate:
                    continue
                hold = self._hold.get(g.name, {})
                for m in members:
                    if m in hold:
                        hold[m] = until

    def release(self, gates: Sequence[Gate], members: list[str]) -> None:
        with self._lock:
            for g in gates:
                for m in members:
                    if not g.is_rate:
                        self._hold.get(g.name, {}).pop(m, None)
                    self._wait.get(g.name, {}).pop(m, None)
