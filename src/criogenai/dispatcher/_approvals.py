"""Human approval: calls of approve-listed tools wait, stored under their run, until a person decides.

A ``PendingApproval`` record is written when the dispatcher first meets such a call and is decided
once, by any process (``Approvals`` or ``criogenai approvals ...``), with a compare-and-set so two
people can never both win. The dispatcher reads the decision when the turn is run again with the
same run id; nothing else carries it, so a process that dies between deciding and resuming loses
nothing. With a Redis URL the records live in Redis for the retention time; without one (the
embedded engine) they live in this process's memory.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

import redis

from .._config import Settings
from .._errors import ApprovalConflict as ApprovalConflict
from .._errors import ApprovalNotFound as ApprovalNotFound
from .._errors import CriogenaiError
from .._errors import InvalidApprovalArguments as InvalidApprovalArguments
from .._wire import PendingApproval as PendingApproval
from .._wire import ToolCall, ToolDefinition
from ..tools._tool import argument_problems


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


class RedisApprovalStore:
    """Records in one hash per run (``<prefix>:{run}:approvals``), plus an index of runs to list."""

    def __init__(self, url: str, *, prefix: str = "crg", retention_secs: int = 7 * 24 * 3600) -> None:
        self.prefix = prefix
        self.retention_secs = retention_secs
        self.client = redis.Redis.from_url(
            url, socket_timeout=10, socket_connect_timeout=5, retry_on_timeout=True
        )
        self._add = self.client.register_script(_ADD)
        self._swap = self.client.register_script(_SWAP)

    def _key(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:approvals"

    @property
    def _index(self) -> str:
        return f"{self.prefix}:approvals"

    def get(self, run_id: str, call_ids: list[str]) -> dict[str, str]:
        if not call_ids:
            return {}
        raw: list[bytes | None] = self.client.hmget(self._key(run_id), call_ids)  # type: ignore[assignment]
        return {c: v.decode() for c, v in zip(call_ids, raw, strict=True) if v is not None}

    def add(self, run_id: str, call_id: str, raw: str, when: float) -> str:
        standing = self._add(keys=[self._key(run_id)], args=[call_id, raw, self.retention_secs])
        # The index only helps listing across runs; it lives in another slot, so it is not in the script.
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(self._index, {run_id: when})
        pipe.zremrangebyscore(self._index, "-inf", time.time() - self.retention_secs)
        pipe.expire(self._index, self.retention_secs)
        pipe.execute()
        return standing.decode() if isinstance(standing, bytes) else str(standing)

    def swap(self, run_id: str, call_id: str, old: str, new: str) -> bool:
        return bool(self._swap(keys=[self._key(run_id)], args=[call_id, old, new, self.retention_secs]))

    def runs(self) -> list[str]:
        since = time.time() - self.retention_secs
        names: list[bytes] = self.client.zrangebyscore(self._index, since, "+inf")  # type: ignore[assignment]
        return [n.decode() for n in names]

    def all(self, run_id: str) -> dict[str, str]:
        raw: dict[bytes, bytes] = self.client.hgetall(self._key(run_id))  # type: ignore[assignment]
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


_MEMORY = MemoryApprovalStore()
"""The embedded engine's store, shared in the process so ``Approvals()`` sees what a Dispatcher asked."""


def approval_store(settings: Settings) -> ApprovalStore:
    """Redis when the settings name one, else this process's memory."""
    if settings.redis_url:
        return RedisApprovalStore(
            settings.redis_url, prefix=settings.key_prefix, retention_secs=settings.retention_secs
        )
    return _MEMORY


def request_approval(
    store: ApprovalStore, run_id: str, call: ToolCall, definition: ToolDefinition
) -> PendingApproval:
    """Put a call to a person, unless it already was; returns the record that stands."""
    now = time.time()
    record = PendingApproval(
        run_id=run_id,
        call=call,
        parameters=definition.parameters,
        schema_hash=definition.schema_hash,
        requested_at=now,
    )
    return PendingApproval.model_validate_json(store.add(run_id, call.id, record.model_dump_json(), now))


def check_edit(record: PendingApproval, arguments: Any) -> list[str]:
    """The problems of edited arguments against the schema the call was put with (empty if fine)."""
    return argument_problems(record.parameters, arguments)


MAX_SWAP_TRIES = 5
"""A swap fails only when another decision landed first, so the second try always settles."""


class Approvals:
    """List and decide pending approvals, from any process that reaches the same Redis.

    A call is decided once. Repeating the decision it already has (approve with the same
    arguments, or reject with the same reason) is accepted and changes nothing, so a retried
    request is harmless; any other second decision raises ``ApprovalConflict``.
    """

    def __init__(self, settings: Settings | None = None, *, store: ApprovalStore | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self.store: ApprovalStore = store or approval_store(self.settings)

    def get(self, run_id: str, call_id: str) -> PendingApproval:
        """The record of one call, whatever its decision; ``ApprovalNotFound`` if there is none."""
        raw = self.store.get(run_id, [call_id]).get(call_id)
        if raw is None:
            raise ApprovalNotFound(f"no approval is stored for call {call_id!r} of run {run_id!r}")
        return PendingApproval.model_validate_json(raw)

    def records(self, run_id: str | None = None, *, decided: bool = False) -> list[PendingApproval]:
        """Records of one run (or of every run), oldest first; undecided only unless ``decided``."""
        out: list[PendingApproval] = []
        for rid in [run_id] if run_id is not None else self.store.runs():
            out.extend(PendingApproval.model_validate_json(raw) for raw in self.store.all(rid).values())
        return sorted(
            (r for r in out if decided or r.decision == "pending"), key=lambda r: (r.requested_at, r.call_id)
        )

    def pending(self, run_id: str | None = None) -> list[PendingApproval]:
        """The calls that still wait for a person, of one run or of every run."""
        return self.records(run_id)

    def approve(
        self, run_id: str, call_id: str, arguments: dict[str, Any] | None = None, by: str = ""
    ) -> PendingApproval:
        """Let the call run, as asked or with ``arguments`` (checked against the tool's schema first:
        ``InvalidApprovalArguments`` lists the problems and nothing is recorded)."""

        def decide(current: PendingApproval) -> PendingApproval:
            edited = arguments
            if edited is not None:
                problems = check_edit(current, edited)
                if problems:
                    raise InvalidApprovalArguments(
                        f"the edited arguments do not fit tool {current.tool_name!r}: " + "; ".join(problems),
                        problems,
                    )
                if edited == current.call.arguments:
                    edited = None
            return current.model_copy(
                update={"decision": "approved", "arguments": edited, "by": by, "decided_at": time.time()}
            )

        return self._decide(run_id, call_id, decide)

    def reject(self, run_id: str, call_id: str, reason: str, by: str = "") -> PendingApproval:
        """Refuse the call; the model gets a ``rejected`` result carrying ``reason``."""
        if not reason.strip():
            raise ValueError("a rejection needs a reason: the model is told it")

        def decide(current: PendingApproval) -> PendingApproval:
            return current.model_copy(
                update={"decision": "rejected", "reason": reason, "by": by, "decided_at": time.time()}
            )

        return self._decide(run_id, call_id, decide)

    def _decide(
        self, run_id: str, call_id: str, decide: Callable[[PendingApproval], PendingApproval]
    ) -> PendingApproval:
        for _ in range(MAX_SWAP_TRIES):
            raw = self.store.get(run_id, [call_id]).get(call_id)
            if raw is None:
                raise ApprovalNotFound(f"no approval is stored for call {call_id!r} of run {run_id!r}")
            current = PendingApproval.model_validate_json(raw)
            if current.decision != "pending":
                wanted = decide(current.model_copy(update={"decision": "pending"}))
                if (wanted.decision, wanted.arguments, wanted.reason) == (
                    current.decision,
                    current.arguments,
                    current.reason,
                ):
                    return current
                who = f" by {current.by}" if current.by else ""
                raise ApprovalConflict(
                    f"call {call_id!r} of run {run_id!r} was already {current.decision}{who}; "
                    f"the first decision stands",
                    current,
                )
            new = decide(current)
            if self.store.swap(run_id, call_id, raw, new.model_dump_json()):
                return new
        raise CriogenaiError(f"call {call_id!r} of run {run_id!r} kept changing while being decided")
