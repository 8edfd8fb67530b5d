"""Run records: each message of an agent run, stored as it happens, and the run's state.

A run is a list of ``RunEntry`` (one per message, in order; a tool message carries its full
``ToolResult``, artifact included) and one ``RunState``. On a fleet both live in Redis under the
run id, kept ``retention_secs`` from the last write; embedded, in this process's memory. An append
names the position it writes, so two processes continuing one run cannot interleave messages.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Literal, Protocol

import redis
from pydantic import Field

from .._config import Settings
from .._errors import RunConflict as RunConflict
from .._errors import RunNotFound as RunNotFound
from .._wire import ToolResult, Versioned
from ._model import Message

RunStatus = Literal["running", "completed", "failed", "waiting_for_approval", "max_rounds"]
MEMORY_RUNS = 1000
"""The embedded store keeps this many runs, dropping the least recently written."""


class _Record(Versioned):
    """A run's stored data, versioned like everything else criogenai keeps."""


class RunEntry(_Record):
    """One stored message of a run; ``result`` is the full result behind a tool message."""

    run_id: str
    seq: int
    at: float
    message: Message
    result: ToolResult | None = None


class RunError(_Record):
    """Why a run failed: ``code`` is ``tool_failed`` or ``model_error``."""

    code: str
    message: str
    call_id: str | None = None


class RunState(_Record):
    """Where a run stands; written at its start and whenever its status changes."""

    run_id: str
    status: RunStatus
    created: float
    updated: float
    error: RunError | None = None
    user: str | None = Field(None, exclude_if=lambda v: v is None)
    """The scope the run's calls carry (``Agent.run(..., user=)``): whose memories they reach."""


class RunStore(Protocol):
    def create(self, state: RunState) -> bool:
        """Store a new run's state; False if the id is taken."""
        ...

    def state(self, run_id: str) -> RunState | None: ...
    def set_state(self, state: RunState) -> None: ...
    def append(self, entry: RunEntry) -> None:
        """Store ``entry`` at position ``entry.seq``; raises RunConflict if that is not the end."""
        ...

    def entries(self, run_id: str) -> list[RunEntry]: ...


# KEYS: entries list, state key. ARGV: expected length, entry JSON, TTL seconds.
_APPEND = """
if redis.call('LLEN', KEYS[1]) ~= tonumber(ARGV[1]) then return -1 end
local n = redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return n
"""


class RedisRunStore:
    """Runs in Redis: ``<prefix>:{run}:agent:messages`` (list) and ``...:agent:state`` (string)."""

    def __init__(self, url: str, *, prefix: str = "crg", retention_secs: int) -> None:
        self.url, self.prefix, self.retention_secs = url, prefix, retention_secs
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> redis.Redis:
        """Connected on first use, so a store made before a fork connects in the child."""
        with self._lock:
            if self._client is None:
                self._client = redis.Redis.from_url(
                    self.url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=10
                )
            return self._client

    def _messages(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:agent:messages"

    def _state(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:agent:state"

    def create(self, state: RunState) -> bool:
        return bool(
            self.client.set(
                self._state(state.run_id), state.model_dump_json(), nx=True, ex=self.retention_secs
            )
        )

    def state(self, run_id: str) -> RunState | None:
        raw = self.client.get(self._state(run_id))
        return RunState.model_validate_json(raw) if raw else None

    def set_state(self, state: RunState) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self._state(state.run_id), state.model_dump_json(), ex=self.retention_secs)
        pipe.expire(self._messages(state.run_id), self.retention_secs)
        pipe.execute()

    def append(self, entry: RunEntry) -> None:
        keys = [self._messages(entry.run_id), self._state(entry.run_id)]
        n = self.client.eval(_APPEND, 2, *keys, entry.seq, entry.model_dump_json(), self.retention_secs)
        if int(n) < 0:
            raise RunConflict(f"run {entry.run_id}: another process wrote message {entry.seq} first")

    def entries(self, run_id: str) -> list[RunEntry]:
        raw = self.client.lrange(self._messages(run_id), 0, -1)
        return [RunEntry.model_validate_json(r) for r in raw]


class MemoryRunStore:
    """Runs in this process (the embedded engine): the latest ``MEMORY_RUNS`` runs are kept."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, tuple[RunState, list[RunEntry]]] = OrderedDict()
        self._lock = threading.Lock()

    def create(self, state: RunState) -> bool:
        with self._lock:
            if state.run_id in self._runs:
                return False
            self._runs[state.run_id] = (state, [])
            while len(self._runs) > MEMORY_RUNS:
                self._runs.popitem(last=False)
            return True

    def state(self, run_id: str) -> RunState | None:
        with self._lock:
            found = self._runs.get(run_id)
            return found[0] if found else None

    def set_state(self, state: RunState) -> None:
        with self._lock:
            _, entries = self._runs.get(state.run_id, (state, []))
            self._runs[state.run_id] = (state, entries)
            self._runs.move_to_end(state.run_id)

    def append(self, entry: RunEntry) -> None:
        with self._lock:
            found = self._runs.get(entry.run_id)
            if found is None:
                raise RunNotFound(f"no run {entry.run_id!r}")
            if len(found[1]) != entry.seq:
                raise RunConflict(f"run {entry.run_id}: another writer wrote message {entry.seq} first")
            found[1].append(entry)
            self._runs.move_to_end(entry.run_id)

    def entries(self, run_id: str) -> list[RunEntry]:
        with self._lock:
            found = self._runs.get(run_id)
            return list(found[1]) if found else []


def make_store(settings: Settings) -> RunStore:
    """Redis when the settings name one (a fleet), this process's memory otherwise (embedded)."""
    if settings.redis_url:
        return RedisRunStore(
            settings.redis_url, prefix=settings.key_prefix, retention_secs=settings.retention_secs
        )
    return MemoryRunStore()


def now() -> float:
    return time.time()
