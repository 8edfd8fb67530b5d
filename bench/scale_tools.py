"""The scale benchmark's tools, the calls it makes of them and the outcome each call must have.

Every run of a tool is counted in a tally Redis of the benchmark's own (``BENCH_SCALE_TALLY_URL``),
which no fault touches: one list per call holding the process group of each run, so the benchmark can
tell which calls ran twice and on which worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import redis

from criogenai import ToolCall, ToolContext, ToolError, ToolResult, tool

MAX_RESULT_CHARS = 100_000
"""The dispatcher's default cut of a result, which ``bulk`` calls cross half the time."""
GATE = 4
"""``gated``'s fleet-wide limit (``max_concurrency``)."""
RUN_KEY, RUNS = "runs:{run_id}:{call_id}", "runs"
GATED_NOW, GATED_PEAK = "gated:now", "gated:peak"

_tally: redis.Redis | None = None
_tally_pid = 0


def tally() -> redis.Redis:
    """This process's client of the tally Redis (a fresh one in a forked child)."""
    global _tally, _tally_pid
    if _tally is None or _tally_pid != os.getpid():
        # Callers wait for one of a few connections: a thousand sync tools at once must not fail here.
        pool = redis.BlockingConnectionPool.from_url(os.environ["BENCH_SCALE_TALLY_URL"], max_connections=32,
                                                     timeout=60)
        _tally, _tally_pid = redis.Redis(connection_pool=pool), os.getpid()
    return _tally


def _ran(ctx: ToolContext) -> None:
    pipe = tally().pipeline(transaction=False)
    pipe.rpush(RUN_KEY.format(run_id=ctx.run_id, call_id=ctx.call_id), os.getpgid(0))
    pipe.incr(RUNS)
    pipe.execute()


@tool(read_only=True)
async def nap(ctx: ToolContext, secs: float) -> float:
    """Wait on the event loop (an API call)."""
    _ran(ctx)
    await asyncio.sleep(secs)
    return secs


@tool
def doze(ctx: ToolContext, secs: float) -> float:
    """Wait on a thread (a blocking client); unmarked, so it must run once."""
    _ran(ctx)
    time.sleep(secs)
    return secs


def crunched(n: int) -> int:
    """What ``crunch(n)`` returns, in closed form (i*i % 7 repeats every 7)."""
    cycle = [i * i % 7 for i in range(7)]
    return n // 7 * sum(cycle) + sum(cycle[: n % 7])


@tool(read_only=True)
def crunch(ctx: ToolContext, n: int) -> int:
    """Hold the CPU."""
    _ran(ctx)
    return sum(i * i % 7 for i in range(n))


@tool(destructive=True)
def fail(ctx: ToolContext, kind: str) -> str:
    """Raise: a ToolError (``tool_error``) or anything else (``exception``)."""
    _ran(ctx)
    if kind == "tool":
        raise ToolError("refused on purpose")
    raise ValueError("broken on purpose")


@tool(timeout_secs=1)
def stall(ctx: ToolContext, secs: float) -> float:
    """A sync tool past its 1 s limit: ``timeout`` (its thread is abandoned until it returns)."""
    _ran(ctx)
    time.sleep(secs)
    return secs


@tool(idempotent=True, timeout_secs=1)
async def hang(ctx: ToolContext, secs: float) -> float:
    """An async tool past its 1 s limit: ``timeout``."""
    _ran(ctx)
    await asyncio.sleep(secs)
    return secs


@tool(destructive=True)
def bulk(ctx: ToolContext, n: int) -> str:
    """A large result, cut past the result limit."""
    _ran(ctx)
    return "x" * n


_ENTER = "local n = redis.call('INCR', KEYS[1]) " \
         "if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end"


@tool(max_concurrency=GATE)
async def gated(ctx: ToolContext, secs: float) -> float:
    """A short wait under a fleet-wide limit; the tally keeps its peak of concurrent runs."""
    _ran(ctx)
    tally().eval(_ENTER, 2, GATED_NOW, GATED_PEAK)
    try:
        await asyncio.sleep(secs)
    finally:
        tally().decr(GATED_NOW)
    return secs


MIX: dict[str, int] = {"nap": 4, "doze": 3, "crunch": 2, "fail": 2, "stall": 1, "hang": 1, "bulk": 1,
                       "gated": 1}
"""Each tool's weight in a turn."""
RETRYABLE = {"nap", "crunch", "hang", "gated"}
"""Read-only or idempotent: may run again (at-least-once); every other call must run once."""


def make_calls(rng: random.Random, k: int) -> list[ToolCall]:
    """K calls drawn from ``MIX``; a call's id names its tool."""
    names = rng.choices(list(MIX), weights=list(MIX.values()), k=k)
    args: dict[str, Any]
    calls = []
    for i, name in enumerate(names):
        if name in ("nap", "doze"):
            args = {"secs": round(rng.uniform(0.05, 0.5), 3)}
        elif name == "crunch":
            args = {"n": rng.randint(1_000, 30_000)}
        elif name == "fail":
            args = {"kind": rng.choice(["tool", "value"])}
        elif name == "stall":
            args = {"secs": 1.4}
        elif name == "hang":
            args = {"secs": 3.0}
        elif name == "bulk":
            args = {"n": rng.randint(50_000, 150_000)}
        else:
            args = {"secs": 0.05}
        calls.append(ToolCall(id=f"c{i}-{name}", name=name, arguments=args))
    return calls


def tool_of(call_id: str) -> str:
    """The tool named by a call id from ``make_calls``."""
    return call_id.rsplit("-", 1)[1]


@dataclass(frozen=True)
class Expected:
    """The status a call must end with, and a check of its content when it does."""

    status: str
    content: str | None = None
    """The exact text, when known."""
    holds: str | None = None
    """A piece the text must hold."""
    length: int | None = None
    truncated: bool = False


def expected(call: ToolCall) -> Expected:
    """What the tool must give for this call, however loaded the fleet."""
    a = call.arguments
    if call.name in ("nap", "doze", "gated"):
        return Expected("ok", json.dumps(a["secs"]))
    if call.name == "crunch":
        return Expected("ok", json.dumps(crunched(a["n"])))
    if call.name == "fail":
        return Expected("tool_error", "refused on purpose") if a["kind"] == "tool" else \
            Expected("exception", holds="broken on purpose")
    if call.name in ("stall", "hang"):
        return Expected("timeout")
    n = a["n"]
    return Expected("ok", length=min(n, MAX_RESULT_CHARS), truncated=n > MAX_RESULT_CHARS)


def check(call: ToolCall, result: ToolResult) -> str:
    """'' when the result is what the tool must give, else what is wrong with it."""
    want = expected(call)
    if result.status != want.status:
        return f"status {result.status}, expected {want.status}: {result.content[:120]!r}"
    if want.content is not None and result.content != want.content:
        return f"content {result.content[:80]!r}, expected {want.content!r}"
    if want.holds is not None and want.holds not in result.content:
        return f"content {result.content[:80]!r} lacks {want.holds!r}"
    if want.length is not None and (len(result.content), result.truncated) != (want.length, want.truncated):
        return f"{len(result.content)} chars (truncated {result.truncated}), expected {want.length}"
    return ""
