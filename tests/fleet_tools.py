"""Tools the integration tests run on real workers. Each counts its real runs in Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from typing import Any

import redis

from criogenai import ToolContext, ToolError, tool

_client: redis.Redis | None = None


def ledger() -> redis.Redis:
    """The test's side-effect ledger: one INCR per real run, keyed by what the test chose."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["CRIOGENAI_TEST_COUNTER_URL"])
    return _client


def runs(key: str) -> int:
    return int(ledger().get(f"test:runs:{key}") or 0)


def _count(key: str) -> int:
    return int(ledger().incr(f"test:runs:{key}"))


@tool(read_only=True)
def echo(text: str) -> str:
    """Return the text."""
    return text


@tool(idempotent=True)
def count(key: str, ctx: ToolContext) -> dict[str, Any]:
    """Count one run under key; say which process ran it."""
    return {"n": _count(key), "pid": os.getpid(), "host": socket.gethostname(), "attempt": ctx.attempt}


@tool
def sleep_for(seconds: float, key: str = "") -> dict[str, Any]:
    """Sleep, then say which process slept."""
    if key:
        _count(key)
    time.sleep(seconds)
    return {"slept": seconds, "pid": os.getpid()}


@tool
async def async_sleep(seconds: float, key: str = "") -> float:
    """Sleep on the event loop; count a cancellation under key + ':cancelled'."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        if key:
            _count(key + ":cancelled")
        raise
    return seconds


@tool(read_only=True)
def flaky_read(key: str, fail_times: int) -> str:
    """Fail with a retryable ToolError on the first fail_times runs."""
    n = _count(key)
    if n <= fail_times:
        raise ToolError(f"not yet ({n})", retryable=True)
    return f"ok after {n}"


@tool(destructive=True)
def flaky_write(key: str, fail_times: int) -> str:
    """The same as flaky_read, but destructive: never retried."""
    n = _count(key)
    if n <= fail_times:
        raise ToolError(f"not yet ({n})", retryable=True)
    return f"ok after {n}"


@tool(read_only=True)
def slow_first_read(key: str, seconds: float) -> str:
    """Sleep past the limit on the first run only."""
    if _count(key) == 1:
        time.sleep(seconds)
    return "fast this time"


@tool
def boom(secret: str) -> str:
    """Raise an unexpected exception whose text holds a secret."""
    raise RuntimeError(f"connection refused for password={secret}")


def _ignore_soft_limit(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except BaseException:  # swallows the soft limit on purpose, like a careless tool
            continue


@tool
def stubborn(seconds: float, key: str = "") -> str:
    """Ignore the soft time limit: catch it and keep sleeping."""
    if key:
        _count(key)
    _ignore_soft_limit(seconds)
    return "finished anyway"


@tool
def die(key: str) -> str:
    """Kill the process running it, every time."""
    _count(key)
    os._exit(1)


@tool
def big(n: int) -> str:
    """Return n characters."""
    return "x" * n


@tool
def not_json() -> Any:
    """Return something that is not JSON."""
    return {1, 2, 3}


@tool(queue="nobody-serves-this")
def orphan() -> str:
    """A tool on a queue no worker consumes."""
    return "never"


# -- fleet operations (tests/integration/test_fleet_ops.py) ---------------------------------------


def _worker_label() -> str:
    """The label the test gave the worker process running the call (its CRIOGENAI_TEST_LABEL)."""
    return os.environ.get("CRIOGENAI_TEST_LABEL", "") or f"{socket.gethostname()}:{os.getpid()}"


@tool(read_only=True)
def where(pause: float = 0.0) -> str:
    """Say which worker ran the call, after an optional pause."""
    if pause:
        time.sleep(pause)
    return _worker_label()


@tool(queue="fleet-gpu", read_only=True)
def where_gpu() -> str:
    """Like where, on a queue of its own (a GPU tool's)."""
    return _worker_label()


# -- fleet-wide limits and cancelling (tests/integration/test_limits_and_cancel.py) ---------------

_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""


def peak(key: str) -> int:
    """The most runs under key that were running at the same moment."""
    return int(ledger().get(f"test:peak:{key}") or 0)


def started_order(key: str) -> list[str]:
    """The tags of the runs under key, in the order they started."""
    return [t.decode() for t in ledger().lrange(f"test:order:{key}", 0, -1)]  # type: ignore[union-attr]


def start_times(key: str) -> list[float]:
    """When each run under key started (time.time(), sorted); every worker of a test is on this host."""
    return sorted(float(t) for t in ledger().lrange(f"test:at:{key}", 0, -1))  # type: ignore[union-attr]


def _gauge(key: str, seconds: float, tag: str) -> int:
    _count(key)
    client = ledger()
    client.rpush(f"test:order:{key}", tag)
    client.rpush(f"test:at:{key}", repr(time.time()))
    client.eval(_ENTER, 2, f"test:live:{key}", f"test:peak:{key}")
    try:
        time.sleep(seconds)
    finally:
        client.decr(f"test:live:{key}")
    return os.getpid()


@tool
def gauge(key: str, seconds: float, tag: str = "") -> int:
    """Run for a while, counting runs under key and the peak of concurrent ones (test:peak:<key>)."""
    return _gauge(key, seconds, tag)


@tool(max_concurrency=2)
def gauge_capped(key: str, seconds: float, tag: str = "") -> int:
    """gauge, with a fleet-wide cap of 2 calls at once set on the tool itself."""
    return _gauge(key, seconds, tag)


@tool(read_only=True)
def report_attempt(ctx: ToolContext, key: str, fail_times: int) -> dict[str, object]:
    """Fail with a retryable ToolError on the first fail_times runs, then say which attempt this is."""
    n = _count(key)
    if n <= fail_times:
        raise ToolError(f"not yet ({n})", retryable=True)
    return {"attempt": ctx.attempt, "call_id": ctx.call_id, "run_id": ctx.run_id}


# -- capacity (tests/integration/test_capacity.py) -------------------------------------------------


@tool(read_only=True)
async def span_async(seconds: float) -> list[float]:
    """Wait on the event loop; return when the wait began and ended (time.time())."""
    began = time.time()
    await asyncio.sleep(seconds)
    return [began, time.time()]


@tool(read_only=True)
def span_sync(seconds: float) -> list[float]:
    """Wait on a thread; return when the wait began and ended (time.time())."""
    began = time.time()
    time.sleep(seconds)
    return [began, time.time()]


class Shutdown(BaseException):
    """Not an Exception: what a library raises to unwind everything (as SystemExit does)."""


@tool
def exits(key: str, secret: str, how: str = "sys.exit") -> str:
    """Count a run, then leave as a careless library does: sys.exit() or a BaseException, with a secret."""
    _count(key)
    if how == "sys.exit":
        raise SystemExit(f"db password is {secret}")
    raise Shutdown(f"db password is {secret}")


# -- stale and replayed messages (tests/integration/test_stale_messages.py) -----------------------


@tool
def count_then_raise(key: str) -> str:
    """Count one run under key, then raise an unexpected exception."""
    n = _count(key)
    raise RuntimeError(f"run {n} failed")


@tool
async def block_loop(seconds: float) -> float:
    """A careless async tool: blocks the event loop (time.sleep in an async def)."""
    time.sleep(seconds)
    return seconds


@tool(timeout_secs=1)
def hang_in_c(key: str, seconds: float = 120.0) -> str:
    """A hostile tool: counts its run, then waits in C (a socket read that gets no data) far past
    its time limit, where the exception raised into its thread cannot reach it."""
    _count(key)
    quiet, _other = socket.socketpair()
    with quiet, _other:
        quiet.settimeout(seconds)
        with contextlib.suppress(TimeoutError):
            quiet.recv(1)
    return "returned at last"


@tool
def log_line(text: str) -> str:
    """Log a line from the tool's own code (a sync tool, on its tool thread)."""
    logging.getLogger("tests.fleet_tools").warning(text)
    return text


@tool(read_only=True, timeout_secs=1)
def stubborn_once(key: str) -> str:
    """Ignore the soft time limit on the first run (so its process is killed at the hard one)."""
    if _count(key) == 1:
        _ignore_soft_limit(30)
    return "second run"


def distinct_runs(key: str) -> int:
    """The runs ``mark_run`` counted under key."""
    return int(ledger().scard(f"test:run-ids:{key}"))


@tool(idempotent=True)
def mark_run(key: str) -> str:
    """Count one run under key with a run id of its own, so that a Redis command the client sends
    again after a killed connection cannot count it twice (INCR could). The kill-storm test kills
    this counter's connections too: the count is tried again until it lands."""
    run_id = uuid.uuid4().hex
    for _ in range(50):
        try:
            ledger().sadd(f"test:run-ids:{key}", run_id)
            return key
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("the test counter did not answer")
