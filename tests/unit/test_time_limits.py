"""Time limits hold even for tools that fight them, and retry waits follow the spec's backoff."""

from __future__ import annotations

import asyncio
import time

from criogenai import ToolContext, tool
from criogenai._config import backoff_secs
from criogenai.runner._executor import execute
from criogenai.tools import DEFAULT_MAX_RESULT_CHARS

CTX = ToolContext(call_id="call-1", run_id="run-1", tool_name="t")


@tool
async def swallows_cancellation(seconds: float) -> str:
    """Catch the cancellation that the time limit sends, and return anyway."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        await asyncio.sleep(0.2)
    return "returned after its limit"


@tool
async def blocks_the_loop(seconds: float) -> str:
    """Block the event loop with a synchronous sleep (a common async mistake)."""
    time.sleep(seconds)
    return "returned after its limit"


def _run(t: object, arguments: dict[str, object], timeout: float) -> object:
    return execute(t, arguments, CTX, timeout_secs=timeout,  # type: ignore[arg-type]
                   on_tool_exception="return_to_model", max_result_chars=DEFAULT_MAX_RESULT_CHARS)


def test_async_tool_that_swallows_its_cancellation_still_times_out() -> None:
    outcome = _run(swallows_cancellation, {"seconds": 5}, timeout=0.3)
    assert outcome.status == "timeout"  # type: ignore[attr-defined]


def test_async_tool_that_blocks_the_loop_is_abandoned_at_its_hard_limit() -> None:
    started = time.monotonic()
    outcome = _run(blocks_the_loop, {"seconds": 1.6}, timeout=0.2)  # hard limit: 1.2 s
    waited = time.monotonic() - started
    assert outcome.status == "timeout"  # type: ignore[attr-defined]
    assert waited < 1.5, f"waited {waited:.1f} s for a 0.2 s limit"
    time.sleep(0.5)  # let the shared loop finish the blocking call before other tests use it


def test_backoff_doubles_from_the_initial_wait_up_to_the_maximum_with_bounded_jitter() -> None:
    # The spec: wait 0.5 s, then 1 s, and so on, with jitter
    plain = [backoff_secs(a, initial=0.5, maximum=30, jitter=0) for a in range(1, 9)]
    assert plain == [0.5, 1, 2, 4, 8, 16, 30, 30]
    jittered = [backoff_secs(1, initial=0.5, maximum=30, jitter=0.25) for _ in range(500)]
    assert all(0.375 <= w <= 0.625 for w in jittered)
    assert len(set(jittered)) > 100  # spread, so that retries of many calls do not arrive together
