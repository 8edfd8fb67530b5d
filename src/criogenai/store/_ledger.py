"""The ledger: per-call claims, run counters and finished results, keyed by (run id, call id).

Celery delivers at least once and never deduplicates task ids, so "a finished call never runs
again" is kept here: a worker claims a call before running it (refused if the call is finished or
another live worker holds it), renews the claim's lease while it runs, and files the result under
the run in the same atomic step that drops the claim and tells the waiting dispatcher.

Who may start a call (``claim``), the rule both implementations keep: a message starts a run of
the call only if the call is not finished, no live run holds it, its run was not cancelled, and
no give-up or failure stops it in this dispatch (see ``Keys.stopped``); and then only while its
deadline lasts, unless the call already started in this dispatch (a retry's ``wait:`` claim, or a
copy re-sent after its worker died: start count > 0), which continues a call its dispatcher still
waits for. So a message replayed after the call's outcome was filed never runs it (``finish``
clears the start count, and a ``fail``ed call is marked stopped), while a re-dispatch of the turn
(``prepare`` first, then new messages with a new deadline) may run a ``fail``ed or given-up call
again.

A claim carries the token of one delivery of the call (a message taken once, by one worker), so
that a step sent again because its reply was lost on the way is known as the same step: a claim
its token holds already is that same run (same attempt, not ``busy``), and a filing that finds its
very result filed is filed. Any other delivery still finds the call ``busy`` or done.

What a finished call leaves in Redis: its entry in the run's results hash, and Celery's result
record only when ``Settings.celery_result_records`` asks for it. Its claim and start count go
when it finishes.

Two implementations share one interface: ``RedisLedger`` for a fleet, ``MemoryLedger`` for the
embedded engine (one process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from pydantic import ValidationError

from .._keys import CELERY_META, KOMBU_UNACKED, KOMBU_UNACKED_INDEX, Keys, task_id
from .._loop import can_wait, pause, wait
from .._wire import FAILED_STATUSES, ToolResult
from ._redis import BLOCKING_TIMEOUT_SECS, redis_client, store_edge, unreachable

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

log = logging.getLogger(__name__)

ClaimKind = Literal["claimed", "done", "busy", "expired", "cancelled"]


@dataclass(frozen=True, slots=True)
class Claim:
    kind: ClaimKind
    attempt: int = 0
    """The run number this claim starts (1 for the first run), when ``kind == "claimed"``."""


@dataclass(frozen=True, slots=True)
class Progress:
    """What the dispatcher can see of an unfinished call."""

    state: Literal["none", "running", "waiting_retry"]
    starts: int


@dataclass(frozen=True, slots=True)
class Look:
    """One run's calls as a monitor sees them: finished ones, and the progress of every one."""

    finished: dict[str, ToolResult]
    progress: dict[str, Progress]


@dataclass(frozen=True, slots=True)
class Renewal:
    """What one round of lease renewal learned: (run, call) pairs."""

    cancelled: list[tuple[str, str]]
    """Their run was cancelled: stop them."""
    lost: list[tuple[str, str]]
    """Their claim is no longer this holder's (it ran out, or the store restarted): the call may be
    run again elsewhere while it still runs here."""


class Ledger(Protocol):
    lease_secs: float
    heartbeat_ttl_secs: float
    celery_records: bool
    """Celery's result record is wanted for every call (``Settings.celery_result_records``)."""
    stores_celery_results: bool
    """``finish`` writes that record itself (the result backend is this Redis)."""
    broker_acks: bool
    """``finish`` also acknowledges the call's broker message (the broker is this Redis)."""

    def claim(self, run_id: str, call_id: str, token: str, deadline: float) -> Claim:
        """Take the call for a run, unless it is finished, held by a live run, or was never
        started and its ``deadline`` (Unix time) has passed. ``token`` is one delivery's own: a
        claim it holds already is that claim sent again (the reply to the first was lost), the
        same run with the same attempt, where any other token finds the call ``busy``."""
        ...

    def renew(self, claims: list[tuple[str, str, str]]) -> Renewal:
        """Extend the leases of running calls; say which were cancelled and which leases were lost."""
        ...

    def cancel(self, run_id: str) -> None:
        """Mark the run cancelled: no call of it starts any more, running ones are told to stop."""
        ...

    def cancelled(self, run_ids: list[str]) -> set[str]:
        """Which of these runs were cancelled."""
        ...

    def await_retry(self, run_id: str, call_id: str, token: str, wait_secs: float) -> None: ...
    def finish(
        self,
        result: ToolResult,
        run_id: str,
        token: str | None,
        reply_to: str | None,
        *,
        done: bool,
        delivery_tag: str | None = None,
    ) -> bool:
        """File a call's result under its run (``done``; else as a failure a re-dispatch may run
        again), drop the claim and the start count, notify ``reply_to``. With ``delivery_tag``,
        also acknowledge the call's broker message in the same round trip (when the broker is
        this Redis). True when filed, or when this very result is filed already (the same filing
        sent again after its reply was lost); False when the call had finished already, or when another
        run holds the claim now (fencing: ``token``'s lease ran out, say a stopped worker resumed,
        and the call runs elsewhere, whose result is the one filed). ``token`` None: any holder."""
        ...
    def release(self, run_id: str, call_id: str) -> None: ...
    def evict(self, run_id: str, call_id: str) -> None:
        """Remove a call's filed result: one a worker with the signing secret found forged, which
        would otherwise keep the call from running (``claim``) or its real result from being filed."""
        ...

    def prepare(self, run_id: str, call_ids: list[str]) -> dict[str, ToolResult]:
        """Before (re)dispatching: the calls already finished; lifts earlier give-ups and failures."""
        ...

    def abandon(self, run_id: str, call_id: str) -> bool:
        """Stop a never-started call: no message of it starts until a re-dispatch. False (and
        nothing marked) if a run of it has started, or it has an outcome."""
        ...

    def give_up(self, run_id: str, call_id: str) -> None:
        """Stop a call its dispatcher reported ``lost``, started or not: no message of it starts
        any more until a re-dispatch (a run going on now may still finish and be filed)."""
        ...

    def finished(self, run_id: str, call_ids: list[str]) -> dict[str, ToolResult]: ...
    def progress(self, run_id: str, call_ids: list[str]) -> dict[str, Progress]: ...
    def look(self, calls: dict[str, list[str]]) -> dict[str, Look]:
        """``finished`` and ``progress`` of many runs' calls at once (a monitor's pass)."""
        ...

    def pop_replies(self, reply_to: str, timeout_secs: float) -> list[ToolResult]: ...
    def wake(self, reply_to: str) -> None:
        """End a ``pop_replies`` waiting on ``reply_to`` now (a closing dispatcher)."""
        ...
    def heartbeat(self, worker: str, queues: list[str], *, stop: bool = False) -> None: ...
    def live_workers(self, queue: str) -> list[str]: ...
    def server_id(self) -> str:
        """Changes when the store restarts and loses what it held (Redis's run_id)."""
        ...

    def close(self) -> None:
        """Let go of the store's connections (a short-lived ledger, say ``fetch_full``'s)."""
        ...


# KEYS: results, claim, starts, cancel mark, stopped. ARGV: call id, token, lease ms, retention
# secs, now, deadline. The rule is the module's docstring's; a claim this token holds already is
# the same claim sent again (its reply was lost): the same run, not a new one.
_CLAIM = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return -1 end
local held = redis.call('GET', KEYS[2])
local mine = held == 'run:' .. ARGV[2]
if held and string.sub(held, 1, 4) == 'run:' and not mine then return -2 end
if redis.call('HEXISTS', KEYS[5], ARGV[1]) == 1 then return -3 end
if redis.call('EXISTS', KEYS[4]) == 1 then return -4 end
if tonumber(ARGV[5]) > tonumber(ARGV[6]) and redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then
  return -3
end
redis.call('SET', KEYS[2], 'run:' .. ARGV[2], 'PX', ARGV[3])
if mine then
  local started = tonumber(redis.call('HGET', KEYS[3], ARGV[1]))
  if started then return started end
end
local n = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
redis.call('EXPIRE', KEYS[3], ARGV[4])
return n
"""

# KEYS: results, stopped. ARGV: call ids. Returns the stored results (or false) and lifts the
# calls' give-ups and failures: this dispatch may run them again.
_PREPARE = """
local out = {}
for i, call in ipairs(ARGV) do
  out[i] = redis.call('HGET', KEYS[1], call)
  redis.call('HDEL', KEYS[2], call)
end
return out
"""

# KEYS: results, claim, starts, stopped. ARGV: call id, retention secs, '1' = only a call that never
# started. A call with an outcome (finished, or failed the turn) is left as it is.
_STOP = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 or redis.call('HGET', KEYS[4], ARGV[1]) == 'failed' then
  return 0
end
if ARGV[3] == '1' then
  if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 0 end
end
redis.call('HSET', KEYS[4], ARGV[1], 'gave_up')
redis.call('EXPIRE', KEYS[4], ARGV[2])
return 1
"""

# KEYS: claim, the run's cancel mark. Returns -1 when the run was cancelled (the lease is still
# renewed: the call runs until it stops), 0 when the claim is no longer this holder's (lost), else 1.
_RENEW = """
local renewed = 0
if redis.call('GET', KEYS[1]) == 'run:' .. ARGV[1] then
  renewed = redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
return renewed
"""

_AWAIT_RETRY = """
if redis.call('GET', KEYS[1]) == 'run:' .. ARGV[1] then
  redis.call('SET', KEYS[1], 'wait:' .. ARGV[1], 'PX', ARGV[2])
end
return 1
"""

# KEYS: results-or-failed hash, results hash, claim, reply list (or a dummy)
# ARGV: call id, result json, retention secs, token ('' = any holder), reply ttl, has reply,
# Celery's result record ('' = none), the message's delivery tag ('' = leave the ack to kombu),
# '1' if the result finishes the call ('0': it failed the turn, or the message was refused)
# KEYS 6 and 7: kombu's unacked hash and index. Acknowledging here spares the worker a round trip
# per call, and makes "result filed" and "message acknowledged" one atomic step.
# KEYS 8 and 9: the run's start counts and stopped calls.
# Returns 1 when filed (or this very result was filed already: the same filing sent again, its
# reply lost), 0 when the call had finished otherwise, -1 when another run holds it (fenced).
_FINISH = """
if ARGV[8] ~= '' then
  redis.call('ZREM', KEYS[7], ARGV[8])
  redis.call('HDEL', KEYS[6], ARGV[8])
end
local held = redis.call('GET', KEYS[3])
if held then
  if ARGV[4] ~= '' and held ~= 'run:' .. ARGV[4] and held ~= 'wait:' .. ARGV[4] then return -1 end
  redis.call('DEL', KEYS[3])
end
if ARGV[9] == '1' or held then redis.call('HDEL', KEYS[8], ARGV[1]) end
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return 1 end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
if ARGV[9] == '0' and held then
  -- a run's outcome that failed the turn: no old message may run the call again (a refusal,
  -- whose token held nothing, stops nothing)
  redis.call('HSET', KEYS[9], ARGV[1], 'failed')
  redis.call('EXPIRE', KEYS[9], ARGV[3])
end
if ARGV[6] == '1' then
  redis.call('RPUSH', KEYS[4], ARGV[2])
  redis.call('EXPIRE', KEYS[4], ARGV[5])
end
if ARGV[7] ~= '' then
  -- Celery's own result record, as its Redis backend writes it (SETEX, then PUBLISH).
  redis.call('SET', KEYS[5], ARGV[7], 'EX', ARGV[3])
  redis.call('PUBLISH', KEYS[5], ARGV[7])
end
return 1
"""

_WAKE = b"wake"
"""Pushed on a reply list to end its dispatcher's blocking pop; never a result."""


def _celery_meta(tid: str, result: ToolResult) -> str:
    """Celery's record for a call: SUCCESS with the result without its artifact (never for models
    or other readers of the backend: it may hold what ``return_generic`` hides), or FAILURE with a
    ``CallFailed`` (status, tool and ids only) for a failed call, as the task ends. Written as text
    around pydantic's own JSON of the result: this runs for every call."""
    done = datetime.now(UTC).isoformat()
    if result.status in FAILED_STATUSES:
        exc = {"exc_type": "CallFailed", "exc_module": "criogenai",
               "exc_message": [result.status, result.name, result.run_id or "", result.call_id]}
        return json.dumps({"status": "FAILURE", "result": exc, "traceback": None, "children": [],
                           "date_done": done, "task_id": tid})
    return (
        f'{{"status":"SUCCESS","result":{result.model_dump_json(exclude={"artifact"})},'
        f'"traceback":null,"children":[],"date_done":"{done}","task_id":{json.dumps(tid)}}}'
    )


def _parsed(raw: list[bytes]) -> list[ToolResult | None]:
    """Stored or popped results, None for an entry that is not one: anyone who can write to Redis
    can put text there, and one bad entry must not lose the others read with it. One warning for all."""
    out: list[ToolResult | None] = []
    for value in raw:
        try:
            out.append(ToolResult.model_validate_json(value))
        except ValidationError:
            out.append(None)
    if None in out:
        log.warning("dropped %d stored result(s) that are not criogenai v1 results", out.count(None))
    return out


def _finished(call_ids: list[str], raw: list[bytes | None]) -> dict[str, ToolResult]:
    """The results among an HMGET of the results hash (or the prepare script's reply)."""
    found = [(cid, v) for cid, v in zip(call_ids, raw, strict=True) if v]
    return {cid: r for (cid, _), r in zip(found, _parsed([v for _, v in found]), strict=True) if r}


def _progress(
    call_ids: list[str], claims: list[bytes | None], starts: list[bytes | None]
) -> dict[str, Progress]:
    """Progress from an MGET of the calls' claims and an HMGET of their start counts."""
    out: dict[str, Progress] = {}
    for cid, held, n in zip(call_ids, claims, starts, strict=True):
        state: Literal["none", "running", "waiting_retry"] = "none"
        if held is not None:
            state = "running" if held.startswith(b"run:") else "waiting_retry"
        out[cid] = Progress(state, int(n or 0))
    return out


class _Connections:
    """Raw connections of a client's pool, lent to one caller at a time; at most ``size`` exist
    (a caller past that waits for one to come back), made again in a forked child (which must not
    share its parent's sockets). For the hottest commands: redis-py's client polls a pooled
    connection for stale data on every command, which costs more CPU than the command itself
    (about 40 of 57 us for a GET). The bound holds however many threads call at once."""

    def __init__(self, client: redis.Redis, size: int) -> None:
        self._pool = client.connection_pool
        self._size = size
        self._free: list[Any] = []
        self._made = 0
        self._pid = os.getpid()
        self._lock = threading.Condition()

    @contextmanager
    def lend(self, timeout: float = 10.0) -> Iterator[Any]:  # redis-py's Connection is untyped
        conn = self._take(timeout)
        try:
            yield conn
        except BaseException:
            conn.disconnect()  # a half-read reply must not be taken for the next command's
            raise
        finally:
            with self._lock:
                if self._pid == os.getpid():
                    self._free.append(conn)
                    self._lock.notify()

    def _take(self, timeout: float) -> Any:
        if self._pid != os.getpid():  # a forked child: nothing of the parent's is its own, lock included
            self._lock, self._free, self._made = threading.Condition(), [], 0
            self._pid = os.getpid()
        with self._lock:
            full = not self._free and self._made >= self._size
            if full and not self._lock.wait_for(lambda: bool(self._free), timeout):
                import redis

                raise redis.ConnectionError(f"no free Redis connection within {timeout:g} s")
            if self._free:
                return self._free.pop()
            self._made += 1
        return self._pool.make_connection()


_Script = tuple["Script", list[str], list[str | int | float], "asyncio.Future[object]"]
"""A script to run for a waiting call: the script, its keys and arguments, where its reply goes."""


class _Batched:
    """Claims and filings of calls that wait on an event loop (``_loop``), sent together on a
    thread of their own: what comes in while one batch is on the wire goes out in the next, in one
    round trip. Sent one by one from the loop's thread, each would hold the loop for its round
    trip, and a thousand calls would queue behind each other's."""

    def __init__(self, connections: _Connections) -> None:
        self._connections = connections
        self._pending: list[_Script] = []
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def run(self, script: Script, keys: list[str], args: list[str | int | float]) -> object:
        """The script's reply (an error reply raised), for a call's greenlet: it waits without
        holding the loop."""
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        with self._ready:
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                self._pid, self._pending = os.getpid(), []
                self._thread = threading.Thread(target=self._serve, name="criogenai-ledger", daemon=True)
                self._thread.start()
            self._pending.append((script, keys, args, future))
            self._ready.notify()
        return wait(future)

    def _serve(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: bool(self._pending))
                batch, self._pending = self._pending, []
            self._send(batch)

    def _send(self, batch: list[_Script]) -> None:
        import redis

        answered = 0
        try:
            with self._connections.lend() as conn:
                commands = [("EVALSHA", s.sha, len(keys), *keys, *args) for s, keys, args, _ in batch]
                conn.send_packed_command(conn.pack_commands(commands))
                for *_, future in batch:
                    try:
                        reply: object = conn.read_response()
                    except redis.ResponseError as exc:  # an error reply (NOSCRIPT, ...): this call's own
                        reply = exc
                    _settle(future, reply)
                    answered += 1
        except BaseException as exc:  # the connection broke: the calls not answered see why
            for *_, future in batch[answered:]:
                _settle(future, exc)


def _settle(future: asyncio.Future[object], reply: object) -> None:
    """Hand a reply (or an error) to the greenlet waiting on ``future``, on its loop."""

    def settle() -> None:
        if future.done():
            return
        if isinstance(reply, BaseException):
            future.set_exception(reply)
        else:
            future.set_result(reply)

    with contextlib.suppress(RuntimeError):  # the caller's loop closed meanwhile: nobody waits
        future.get_loop().call_soon_threadsafe(settle)


class _HotScripts:
    """Runs the per-call scripts (claim, finish): batched for calls waiting on an event loop
    (``_Batched``), else one round trip on a lent connection; a lost connection is made again and
    the script sent again, as the client's own retries would."""

    _RETRY_DELAYS = (0.05, 0.25, 1.0, None)

    def __init__(self, client: redis.Redis) -> None:
        from redis.exceptions import NoScriptError

        self._client = client
        self._connections = _Connections(client, HOT_CONNECTIONS)
        self._batched = _Batched(self._connections)
        self._no_script, self._unreachable = NoScriptError, unreachable()
        self._loads: dict[int, int] = {}
        """Script → how many times it was loaded again; the calls whose batch met NOSCRIPT together
        load it once, not once each (a thousand round trips on the loop after a restart)."""
        self._load_lock = threading.Lock()

    def run(self, script: Script, keys: list[str], args: list[str | int | float]) -> object:
        for delay in self._RETRY_DELAYS:
            try:
                loads = self._loads.get(id(script), 0)
                try:
                    return self._once(script, keys, args)
                except self._no_script:  # the server restarted or was flushed: load it again
                    with self._load_lock:
                        if self._loads.get(id(script), 0) == loads:
                            script.sha = self._client.script_load(script.script)
                            self._loads[id(script)] = loads + 1
                    return self._once(script, keys, args)
            except self._unreachable:
                if delay is None:
                    raise
                pause(delay)
        raise AssertionError("unreachable")

    def _once(self, script: Script, keys: list[str], args: list[str | int | float]) -> object:
        if can_wait():
            return self._batched.run(script, keys, args)
        with self._connections.lend() as conn:
            conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return cast(object, conn.read_response())


HOT_CONNECTIONS = 8
"""Connections a process's claims and filings share (a worker on criogenai's threads pool sends
them in batches from one thread, ``_Batched``, so it uses one)."""
_CLAIM_CODES = {-1: Claim("done"), -2: Claim("busy"), -3: Claim("expired"), -4: Claim("cancelled")}
REPLY_TTL_SECS = 3600
HEARTBEAT_TTL_SECS = 15.0


@store_edge
class RedisLedger:
    """The ledger on Redis: a few Lua scripts, one round trip per step. It raises ``StoreError``
    (``StoreUnavailable`` when Redis did not answer, after its own quick retries)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "crg",
        lease_secs: float = 10.0,
        retention_secs: int = 7 * 24 * 3600,
        heartbeat_ttl_secs: float = HEARTBEAT_TTL_SECS,
        celery_records: bool = False,
        celery_results: bool = False,
        broker_acks: bool = False,
    ) -> None:
        self.keys = Keys(prefix)
        self.celery_records = celery_records
        self.stores_celery_results = celery_records and celery_results
        """Write Celery's ``celery-task-meta-<id>`` record in ``finish`` (one round trip instead
        of three; ``celery_results``: the result backend is this Redis), so the worker's task can
        skip Celery's own result store."""
        self.broker_acks = broker_acks
        """The broker is this Redis: ``finish`` may acknowledge the call's message too."""
        self.lease_secs = lease_secs
        self.retention_secs = retention_secs
        self.heartbeat_ttl_secs = heartbeat_ttl_secs
        self.client = redis_client(url)
        # Blocking pops get their own pool, with a socket timeout longer than any block.
        self._blocking = redis_client(url, timeout_secs=BLOCKING_TIMEOUT_SECS)
        self._replies = _Connections(self._blocking, 4)
        self._claim = self.client.register_script(_CLAIM)
        self._renew = self.client.register_script(_RENEW)
        self._await_retry = self.client.register_script(_AWAIT_RETRY)
        self._finish = self.client.register_script(_FINISH)
        self._prepare = self.client.register_script(_PREPARE)
        self._stop = self.client.register_script(_STOP)
        self._hot = _HotScripts(self.client)

    def claim(self, run_id: str, call_id: str, token: str, deadline: float) -> Claim:
        k = self.keys
        keys = [
            k.results(run_id), k.claim(run_id, call_id), k.starts(run_id), k.cancel(run_id), k.stopped(run_id)
        ]
        lease_ms = int(self.lease_secs * 1000)
        args: list[str | int | float] = [
            call_id, token, lease_ms, self.retention_secs, repr(time.time()), repr(deadline)
        ]
        n = int(cast(int, self._hot.run(self._claim, keys, args)))
        return _CLAIM_CODES.get(n) or Claim("claimed", n)

    def renew(self, claims: list[tuple[str, str, str]]) -> Renewal:
        if not claims:
            return Renewal([], [])
        pipe = self.client.pipeline(transaction=False)
        for run_id, call_id, token in claims:
            self._renew(
                keys=[self.keys.claim(run_id, call_id), self.keys.cancel(run_id)],
                args=[token, int(self.lease_secs * 1000)],
                client=pipe,
            )
        out = Renewal([], [])
        for (run, call, _), n in zip(claims, pipe.execute(), strict=True):
            if int(n) == -1:
                out.cancelled.append((run, call))
            elif int(n) == 0:
                out.lost.append((run, call))
        return out

    def cancel(self, run_id: str) -> None:
        self.client.set(self.keys.cancel(run_id), "1", ex=self.retention_secs)

    def cancelled(self, run_ids: list[str]) -> set[str]:
        if not run_ids:
            return set()
        pipe = self.client.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.exists(self.keys.cancel(run_id))
        return {r for r, n in zip(run_ids, pipe.execute(), strict=True) if n}

    def await_retry(self, run_id: str, call_id: str, token: str, wait_secs: float) -> None:
        ms = int((wait_secs + self.lease_secs) * 1000)
        # As a claim or a filing: batched for a call waiting on the loop, which it must not block.
        self._hot.run(self._await_retry, [self.keys.claim(run_id, call_id)], [token, ms])

    def finish(
        self,
        result: ToolResult,
        run_id: str,
        token: str | None,
        reply_to: str | None,
        *,
        done: bool,
        delivery_tag: str | None = None,
    ) -> bool:
        k = self.keys
        tag = delivery_tag if delivery_tag and self.broker_acks else ""
        target = k.results(run_id) if done else k.failed(run_id)
        reply = reply_to or k.reply("none")
        tid = task_id(run_id, result.call_id)
        keys = [
            target,
            k.results(run_id),
            k.claim(run_id, result.call_id),
            reply,
            CELERY_META + tid,
            KOMBU_UNACKED,
            KOMBU_UNACKED_INDEX,
            k.starts(run_id),
            k.stopped(run_id),
        ]
        args: list[str | int | float] = [
            result.call_id,
            result.model_dump_json(),
            self.retention_secs,
            token or "",
            REPLY_TTL_SECS,
            "1" if reply_to else "0",
            _celery_meta(tid, result) if self.stores_celery_results else "",
            tag,
            "1" if done else "0",
        ]
        return int(cast(int, self._hot.run(self._finish, keys, args))) == 1

    def release(self, run_id: str, call_id: str) -> None:
        self.client.delete(self.keys.claim(run_id, call_id))

    def evict(self, run_id: str, call_id: str) -> None:
        self.client.hdel(self.keys.results(run_id), call_id)

    def prepare(self, run_id: str, call_ids: list[str]) -> dict[str, ToolResult]:
        if not call_ids:
            return {}
        raw = self._prepare(keys=[self.keys.results(run_id), self.keys.stopped(run_id)], args=call_ids)
        return _finished(call_ids, raw)

    def abandon(self, run_id: str, call_id: str) -> bool:
        return self._stop_call(run_id, call_id, only_unstarted=True)

    def give_up(self, run_id: str, call_id: str) -> None:
        self._stop_call(run_id, call_id, only_unstarted=False)

    def _stop_call(self, run_id: str, call_id: str, *, only_unstarted: bool) -> bool:
        k = self.keys
        keys = [k.results(run_id), k.claim(run_id, call_id), k.starts(run_id), k.stopped(run_id)]
        args: list[str | int] = [call_id, self.retention_secs, "1" if only_unstarted else "0"]
        return bool(self._stop(keys=keys, args=args))

    def finished(self, run_id: str, call_ids: list[str]) -> dict[str, ToolResult]:
        if not call_ids:
            return {}
        raw = cast(list[bytes | None], self.client.hmget(self.keys.results(run_id), call_ids))
        return _finished(call_ids, raw)

    def progress(self, run_id: str, call_ids: list[str]) -> dict[str, Progress]:
        if not call_ids:
            return {}
        # One round trip: a monitor looks at thousands of calls.
        pipe = self.client.pipeline(transaction=False)
        self._ask_progress(pipe, run_id, call_ids)
        claims, starts = pipe.execute()
        return _progress(call_ids, claims, starts)

    def look(self, calls: dict[str, list[str]]) -> dict[str, Look]:
        # One round trip for every run: with many small turns in flight, a round trip or two per
        # run and pass was most of a dispatcher's monitoring cost.
        runs = [(run_id, ids) for run_id, ids in calls.items() if ids]
        if not runs:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for run_id, ids in runs:
            pipe.hmget(self.keys.results(run_id), ids)
            self._ask_progress(pipe, run_id, ids)
        raw = pipe.execute()
        return {
            run_id: Look(_finished(ids, raw[3 * i]), _progress(ids, raw[3 * i + 1], raw[3 * i + 2]))
            for i, (run_id, ids) in enumerate(runs)
        }

    def _ask_progress(self, pipe: Any, run_id: str, call_ids: list[str]) -> None:
        """Queue the two reads of ``_progress`` (an MGET of claims, an HMGET of start counts)."""
        pipe.mget([self.keys.claim(run_id, c) for c in call_ids])
        pipe.hmget(self.keys.starts(run_id), call_ids)

    def pop_replies(self, reply_to: str, timeout_secs: float) -> list[ToolResult]:
        # The hottest command of a dispatcher (one per batch of results).
        with self._replies.lend() as conn:
            conn.send_command("BLMPOP", timeout_secs, 1, reply_to, "LEFT", "COUNT", 512)
            popped = conn.read_response()
        if not popped:
            return []
        _key, values = popped
        return [r for r in _parsed([v for v in values if v != _WAKE]) if r is not None]

    def wake(self, reply_to: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(reply_to, _WAKE)
        pipe.expire(reply_to, 60)  # left behind when the gatherer was not popping: it goes
        pipe.execute()

    def heartbeat(self, worker: str, queues: list[str], *, stop: bool = False) -> None:
        pipe = self.client.pipeline(transaction=False)
        now = time.time()
        for q in queues:
            key = self.keys.workers(q)
            if stop:
                pipe.zrem(key, worker)
            else:
                pipe.zadd(key, {worker: now})
                pipe.zremrangebyscore(key, "-inf", now - 10 * self.heartbeat_ttl_secs)
                pipe.expire(key, int(10 * self.heartbeat_ttl_secs))
        pipe.execute()

    def live_workers(self, queue: str) -> list[str]:
        now = time.time()
        key = self.keys.workers(queue)
        names: list[bytes] = self.client.zrangebyscore(key, now - self.heartbeat_ttl_secs, "+inf")  # type: ignore[assignment]
        return [n.decode() for n in names]

    def server_id(self) -> str:
        return str(self.client.info("server")["run_id"])

    def server_version(self) -> str:
        """The server's ``redis_version`` ("" when not said); a refused login raises here."""
        self.client.ping()
        return str(self.client.info("server").get("redis_version", ""))

    def close(self) -> None:
        self.client.close()
        self._blocking.close()


class MemoryLedger:
    """The ledger in one process's memory, for the embedded engine. Same rules, one lock."""

    def __init__(self, *, lease_secs: float = 10.0, heartbeat_ttl_secs: float = HEARTBEAT_TTL_SECS) -> None:
        self.lease_secs = lease_secs
        self.heartbeat_ttl_secs = heartbeat_ttl_secs
        self.celery_records = False
        self.stores_celery_results = False
        self.broker_acks = False
        self._lock = threading.Condition()
        self._results: dict[str, dict[str, ToolResult]] = defaultdict(dict)
        self._failed: dict[str, dict[str, ToolResult]] = defaultdict(dict)
        self._claims: dict[tuple[str, str], tuple[str, float]] = {}
        self._starts: dict[tuple[str, str], int] = defaultdict(int)
        self._stopped: dict[tuple[str, str], str] = {}
        self._replies: dict[str, list[ToolResult]] = defaultdict(list)
        self._workers: dict[str, dict[str, float]] = defaultdict(dict)
        self._cancelled: set[str] = set()
        self._woken: set[str] = set()

    def _held(self, key: tuple[str, str]) -> str | None:
        held = self._claims.get(key)
        if held is None or held[1] < time.monotonic():
            self._claims.pop(key, None)
            return None
        return held[0]

    def claim(self, run_id: str, call_id: str, token: str, deadline: float) -> Claim:
        key = (run_id, call_id)
        with self._lock:
            if call_id in self._results[run_id]:
                return Claim("done")
            held = self._held(key)
            mine = held == "run:" + token
            if held is not None and held.startswith("run:") and not mine:
                return Claim("busy")
            if key in self._stopped:
                return Claim("expired")
            if run_id in self._cancelled:
                return Claim("cancelled")
            if time.time() > deadline and not self._starts.get(key):
                return Claim("expired")
            self._claims[key] = ("run:" + token, time.monotonic() + self.lease_secs)
            if not (mine and self._starts.get(key)):
                self._starts[key] += 1
            return Claim("claimed", self._starts[key])

    def renew(self, claims: list[tuple[str, str, str]]) -> Renewal:
        out = Renewal([], [])
        with self._lock:
            for run_id, call_id, token in claims:
                if run_id in self._cancelled:
                    out.cancelled.append((run_id, call_id))
                if self._held((run_id, call_id)) == "run:" + token:
                    self._claims[(run_id, call_id)] = (
                        "run:" + token,
                        time.monotonic() + self.lease_secs,
                    )
                elif run_id not in self._cancelled:
                    out.lost.append((run_id, call_id))
        return out

    def cancel(self, run_id: str) -> None:
        with self._lock:
            self._cancelled.add(run_id)

    def cancelled(self, run_ids: list[str]) -> set[str]:
        with self._lock:
            return {r for r in run_ids if r in self._cancelled}

    def await_retry(self, run_id: str, call_id: str, token: str, wait_secs: float) -> None:
        with self._lock:
            if self._held((run_id, call_id)) == "run:" + token:
                self._claims[(run_id, call_id)] = (
                    "wait:" + token,
                    time.monotonic() + wait_secs + self.lease_secs,
                )

    def finish(
        self,
        result: ToolResult,
        run_id: str,
        token: str | None,
        reply_to: str | None,
        *,
        done: bool,
        delivery_tag: str | None = None,
    ) -> bool:
        key = (run_id, result.call_id)
        with self._lock:
            held = self._held(key)
            if held is not None:
                if token is not None and held not in ("run:" + token, "wait:" + token):
                    return False  # fenced: another run holds the call
                self._claims.pop(key, None)
            if done or held is not None:
                self._starts.pop(key, None)
            if (self._results if done else self._failed)[run_id].get(result.call_id) == result:
                return True  # filed already: the same filing again
            if result.call_id in self._results[run_id]:
                return False
            (self._results if done else self._failed)[run_id][result.call_id] = result
            if not done and held is not None:
                self._stopped[key] = "failed"
            if reply_to:
                self._replies[reply_to].append(result)
                self._lock.notify_all()
            return True

    def release(self, run_id: str, call_id: str) -> None:
        with self._lock:
            self._claims.pop((run_id, call_id), None)

    def evict(self, run_id: str, call_id: str) -> None:
        with self._lock:
            self._results[run_id].pop(call_id, None)

    def prepare(self, run_id: str, call_ids: list[str]) -> dict[str, ToolResult]:
        with self._lock:
            for cid in call_ids:
                self._stopped.pop((run_id, cid), None)
        return self.finished(run_id, call_ids)

    def abandon(self, run_id: str, call_id: str) -> bool:
        return self._stop_call(run_id, call_id, only_unstarted=True)

    def give_up(self, run_id: str, call_id: str) -> None:
        self._stop_call(run_id, call_id, only_unstarted=False)

    def _stop_call(self, run_id: str, call_id: str, *, only_unstarted: bool) -> bool:
        key = (run_id, call_id)
        with self._lock:
            if call_id in self._results[run_id] or self._stopped.get(key) == "failed":
                return False
            if only_unstarted and (self._starts.get(key) or self._held(key) is not None):
                return False
            self._stopped[key] = "gave_up"
            return True

    def finished(self, run_id: str, call_ids: list[str]) -> dict[str, ToolResult]:
        with self._lock:
            done = self._results.get(run_id, {})
            return {cid: done[cid] for cid in call_ids if cid in done}

    def progress(self, run_id: str, call_ids: list[str]) -> dict[str, Progress]:
        out: dict[str, Progress] = {}
        with self._lock:
            for cid in call_ids:
                held = self._held((run_id, cid))
                state: Literal["none", "running", "waiting_retry"] = "none"
                if held is not None:
                    state = "running" if held.startswith("run:") else "waiting_retry"
                out[cid] = Progress(state, self._starts.get((run_id, cid), 0))
        return out

    def look(self, calls: dict[str, list[str]]) -> dict[str, Look]:
        return {run: Look(self.finished(run, ids), self.progress(run, ids)) for run, ids in calls.items()}

    def pop_replies(self, reply_to: str, timeout_secs: float) -> list[ToolResult]:
        with self._lock:
            self._lock.wait_for(lambda: bool(self._replies.get(reply_to)) or reply_to in self._woken,
                                timeout_secs)
            self._woken.discard(reply_to)
            return self._replies.pop(reply_to, [])

    def wake(self, reply_to: str) -> None:
        with self._lock:
            self._woken.add(reply_to)
            self._lock.notify_all()

    def heartbeat(self, worker: str, queues: list[str], *, stop: bool = False) -> None:
        with self._lock:
            for q in queues:
                if stop:
                    self._workers[q].pop(worker, None)
                else:
                    self._workers[q][worker] = time.monotonic()

    def live_workers(self, queue: str) -> list[str]:
        with self._lock:
            now = time.monotonic()
            return [w for w, t in self._workers[queue].items() if now - t < self.heartbeat_ttl_secs]

    def server_id(self) -> str:
        return "memory"

    def close(self) -> None:
        """Nothing to let go of."""
