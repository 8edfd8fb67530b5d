"""The embedded engine (no broker): calls run in this process with the worker's rules."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from criogenai import Dispatcher, Retry, Settings, ToolCall, ToolContext, ToolError, ToolFailed, tool
from criogenai._signing import sign
from criogenai._wire import ToolTask
from criogenai.dispatcher._admission import Send
from criogenai.dispatcher._inprocess import InProcessEngine
from criogenai.store._ledger import MemoryLedger
from criogenai.tools import ToolRegistry
from tests.conftest import key

RUNS: Counter[str] = Counter()
ATTEMPTS: dict[str, list[int]] = {}
SECRET = "a-secret-of-enough-length"


@tool(read_only=True)
def flaky(key: str, fail_times: int, ctx: ToolContext) -> str:
    """Fail with a retryable ToolError on the first fail_times runs."""
    RUNS[key] += 1
    ATTEMPTS.setdefault(key, []).append(ctx.attempt)
    if RUNS[key] <= fail_times:
        raise ToolError(f"not yet ({RUNS[key]})", retryable=True)
    return f"ok after {RUNS[key]}"


@tool
def flaky_write(key: str, fail_times: int) -> str:
    """Not read-only: never retried."""
    RUNS[key] += 1
    if RUNS[key] <= fail_times:
        raise ToolError(f"not yet ({RUNS[key]})", retryable=True)
    return "written"


@tool
def counted(key: str) -> int:
    """Count a run under key."""
    RUNS[key] += 1
    return RUNS[key]


@tool
def boom(key: str) -> str:
    """Count a run, then raise."""
    RUNS[key] += 1
    raise RuntimeError(f"broken {key}")


@tool
def nap(seconds: float) -> float:
    """Sleep on a thread."""
    time.sleep(seconds)
    return seconds


@tool
async def async_nap(seconds: float, key: str = "") -> float:
    """Sleep on the event loop; count a cancellation under key."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        RUNS[key + ":cancelled"] += 1
        raise
    return seconds


@tool
def grow(items: list[int]) -> list[int]:
    """Append to the list it was given."""
    items.append(99)
    return items


@tool
def big(n: int) -> str:
    """Return n characters."""
    return "x" * n


@tool(queue="gpu-only")
def on_gpu() -> str:
    """A tool routed to a queue of its own."""
    return "ran"


TOOLS = [flaky, flaky_write, counted, boom, nap, async_nap, grow, big, on_gpu]



@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    with Dispatcher(TOOLS, settings=Settings(), tool_retry=Retry(initial_backoff=0.01)) as d:
        yield d


def test_a_read_only_tool_is_retried_with_backoff_and_counts_its_attempts(dispatcher: Dispatcher) -> None:
    k = key()
    [r] = dispatcher.run_turn_sync([ToolCall(id="r", name="flaky", arguments={"key": k, "fail_times": 2})])
    assert (r.status, r.content, r.attempts) == ("ok", "ok after 3", 3)
    assert ATTEMPTS[k] == [1, 2, 3]


def test_a_read_only_tool_gives_up_after_max_attempts(dispatcher: Dispatcher) -> None:
    k = key()
    [r] = dispatcher.run_turn_sync([ToolCall(id="r", name="flaky", arguments={"key": k, "fail_times": 9})])
    assert (r.status, r.content, r.attempts) == ("tool_error", "not yet (3)", 3)
    assert RUNS[k] == 3


def test_a_tool_that_is_not_read_only_is_never_retried(dispatcher: Dispatcher) -> None:
    k = key()
    call = ToolCall(id="w", name="flaky_write", arguments={"key": k, "fail_times": 1})
    [r] = dispatcher.run_turn_sync([call])
    assert (r.status, r.content, r.attempts) == ("tool_error", "not yet (1)", 1)
    assert RUNS[k] == 1


def test_running_a_turn_again_with_its_run_id_does_not_run_finished_calls(dispatcher: Dispatcher) -> None:
    k = key()
    calls = [ToolCall(id=f"c{i}", name="counted", arguments={"key": k}) for i in range(3)]
    first = dispatcher.run_turn_sync(calls, run_id="run-" + k)
    again = dispatcher.run_turn_sync(calls, run_id="run-" + k)
    assert RUNS[k] == 3
    assert [r.content for r in again] == [r.content for r in first]
    assert sorted(r.content for r in first) == ["1", "2", "3"]


def test_a_call_that_failed_the_turn_runs_again_when_the_turn_is_run_again() -> None:
    k = key()
    with Dispatcher(TOOLS, settings=Settings(), on_tool_exception="fail") as d:
        calls = [ToolCall(id="ok", name="counted", arguments={"key": k}),
                 ToolCall(id="x", name="boom", arguments={"key": k + "b"})]
        for _ in range(2):
            with pytest.raises(ToolFailed) as info:
                d.run_turn_sync(calls, run_id="run-" + k)
            assert [r.status for r in info.value.results] == ["ok", "exception"]
    assert (RUNS[k], RUNS[k + "b"]) == (1, 2)


def test_under_fail_the_turn_fails_caused_by_the_tools_own_exception_object() -> None:
    """Embedded, the exception a tool raised exists in this process: ``ToolFailed.__cause__`` is
    that object, with its type and traceback, not a description of it (as a fleet must give)."""
    k = key()

    async def main() -> BaseException | None:
        with Dispatcher(TOOLS, settings=Settings(), on_tool_exception="fail") as d:
            with pytest.raises(ToolFailed) as info:
                await d.run_turn([ToolCall(id="x", name="boom", arguments={"key": k})])
            return info.value.__cause__

    for cause in (asyncio.run(main()), _sync_cause(k)):
        assert type(cause) is RuntimeError and str(cause) == f"broken {k}"
        assert cause.__traceback__ is not None


def _sync_cause(k: str) -> BaseException | None:
    with Dispatcher(TOOLS, settings=Settings(), on_tool_exception="fail") as d:
        with pytest.raises(ToolFailed) as info:
            d.run_turn_sync([ToolCall(id="x", name="boom", arguments={"key": k})])
        return info.value.__cause__


@tool
async def fails_when_cut(seconds: float) -> str:
    """Sleep; cancelled, fail in its own clean-up instead of ending cancelled (as an MCP client may)."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        raise RuntimeError("connection torn down mid-request") from None
    return "done"


def test_an_async_tool_that_fails_while_cut_at_its_limit_ends_timeout_not_exception() -> None:
    with Dispatcher([fails_when_cut], settings=Settings(), limits={"tool_timeout_secs": 0.3}) as d:
        [r] = d.run_turn_sync([ToolCall(id="c", name="fails_when_cut", arguments={"seconds": 5})])
    assert r.status == "timeout", r


@tool
async def async_exits(how: str) -> str:
    """Leave by sys.exit() or KeyboardInterrupt from an async tool."""
    await asyncio.sleep(0)
    if how == "exit":
        sys.exit("leaving")
    raise KeyboardInterrupt


def test_an_async_tool_that_calls_sys_exit_fails_alone_and_the_loop_keeps_serving() -> None:
    """asyncio re-raises SystemExit and KeyboardInterrupt out of the event loop: unhandled, they
    would end the loop every call runs on. They are the tool's failure, like any exception."""
    tools = [async_exits, nap]
    calls = [ToolCall(id=h, name="async_exits", arguments={"how": h}) for h in ("exit", "interrupt")]
    with Dispatcher(tools, settings=Settings()) as d:
        assert [r.status for r in d.run_turn_sync(calls)] == ["exception", "exception"]
        [after] = d.run_turn_sync([ToolCall(id="n", name="nap", arguments={"seconds": 0})])
    assert after.status == "ok"

    async def on_my_loop() -> list[str]:
        with Dispatcher(tools, settings=Settings()) as d:
            results = await d.run_turn(calls)
            await asyncio.sleep(0)  # the application's loop still runs
            return [r.status for r in results]

    assert asyncio.run(on_my_loop()) == ["exception", "exception"]


def test_sync_and_async_tools_past_their_limit_time_out() -> None:
    k = key()
    with Dispatcher(TOOLS, settings=Settings(), limits={"tool_timeout_secs": 0.3}) as d:
        started = time.monotonic()
        sync, asyn = d.run_turn_sync([
            ToolCall(id="s", name="nap", arguments={"seconds": 5}),
            ToolCall(id="a", name="async_nap", arguments={"seconds": 5, "key": k}),
        ])
        elapsed = time.monotonic() - started
    assert (sync.status, asyn.status) == ("timeout", "timeout")
    assert sync.content == "Tool 'nap' did not finish within 0.3 s."
    assert asyn.content == "Tool 'async_nap' did not finish within 0.3 s."
    assert elapsed < 4
    assert RUNS[k + ":cancelled"] == 1, "the async tool was not cancelled"


def test_a_tool_gets_its_own_copy_of_the_arguments(dispatcher: Dispatcher) -> None:
    items = [1, 2]
    [r] = dispatcher.run_turn_sync([ToolCall(id="g", name="grow", arguments={"items": items})])
    assert r.content == "[1, 2, 99]"
    assert items == [1, 2]


def test_every_tool_runs_in_process_whatever_its_queue(dispatcher: Dispatcher) -> None:
    [r] = dispatcher.run_turn_sync([ToolCall(id="q", name="on_gpu", arguments={})])
    assert (r.status, r.content) == ("ok", "ran")


def test_a_cut_result_keeps_its_full_text_with_the_run() -> None:
    with Dispatcher(TOOLS, settings=Settings(), limits={"max_result_chars": 100}) as d:
        [r] = d.run_turn_sync([ToolCall(id="b", name="big", arguments={"n": 500})])
        assert r.truncated and len(r.content) == 100
        assert d.fetch_full(r.run_id, "b") == "x" * 500


def test_many_concurrent_turns_from_one_event_loop_all_complete(dispatcher: Dispatcher) -> None:
    async def many() -> list[list[str]]:
        calls = [ToolCall(id=f"c{i}", name="nap", arguments={"seconds": 0.01}) for i in range(10)]
        turns = [dispatcher.run_turn(calls) for _ in range(30)]
        return [[r.status for r in rs] for rs in await asyncio.gather(*turns)]

    assert asyncio.run(many()) == [["ok"] * 10] * 30


def test_signed_calls_run_and_unsigned_or_altered_ones_are_refused() -> None:
    k = key()
    with Dispatcher(TOOLS, settings=Settings(signing_secret=SECRET)) as d:
        [r] = d.run_turn_sync([ToolCall(id="s", name="counted", arguments={"key": k})])
    assert (r.status, RUNS[k]) == ("ok", 1)

    engine = InProcessEngine(ToolRegistry(TOOLS), MemoryLedger(), d.limits, signing_secret=SECRET)
    try:
        task = ToolTask(run_id="r1", call=ToolCall(id="u", name="counted", arguments={"key": k}),
                        timeout_secs=5, max_attempts=1, initial_backoff_secs=0, max_backoff_secs=0,
                        jitter=0, on_tool_exception="return_to_model", max_result_chars=100,
                        deadline=time.time() + 60)
        altered = sign(task, SECRET).model_copy(
            update={"call": ToolCall(id="a", name="counted", arguments={"key": k + "x"})})
        sends = [Send(task, "criogenai", False), Send(altered, "criogenai", False)]
        results = engine.submit("r1", sends, check_finished=False).result(timeout=10)
    finally:
        engine.close()
    assert [results[c].status for c in ("u", "a")] == ["not_started", "not_started"]
    assert "not signed" in results["u"].content
    assert "does not match" in results["a"].content
    assert (RUNS[k], RUNS[k + "x"]) == (1, 0)


def test_closing_the_dispatcher_answers_a_call_in_flight() -> None:
    d = Dispatcher(TOOLS, settings=Settings())
    out: list[str] = []
    runner = threading.Thread(
        target=lambda: out.extend(
            r.status for r in d.run_turn_sync([ToolCall(id="n", name="nap", arguments={"seconds": 3})])
        )
    )
    runner.start()
    time.sleep(0.3)
    d.close()
    runner.join(timeout=5)
    assert out == ["lost"]


def test_a_rate_limit_spaces_a_turns_calls_in_the_embedded_engine() -> None:
    from criogenai import Limits

    with Dispatcher(TOOLS, settings=Settings(), limits=Limits(tool_rate={"nap": "3/s"})) as d:
        started = time.monotonic()
        results = d.run_turn_sync([ToolCall(id=f"c{i}", name="nap", arguments={"seconds": 0})
                                   for i in range(6)])
        elapsed = time.monotonic() - started
    assert [r.status for r in results] == ["ok"] * 6
    assert elapsed >= 0.95, elapsed  # the second three waited for the first second's window


@pytest.mark.parametrize("rate", ["10", "0/s", "ten/s", "5/d", "-1/m", ""])
def test_a_malformed_rate_is_refused_with_the_expected_format(rate: str) -> None:
    from criogenai import ConfigurationError, Limits

    with pytest.raises((ConfigurationError, ValueError), match="like '10/s'"):
        Limits(tool_rate={"nap": rate})


def test_cancelling_a_turn_in_the_embedded_engine_stops_running_calls_and_skips_waiting_ones() -> None:
    from criogenai import Limits

    k = key()
    limits = Limits(max_calls_in_flight_per_turn=2)
    calls = [ToolCall(id=f"a{i}", name="async_nap", arguments={"seconds": 30, "key": k}) for i in range(2)]
    calls += [ToolCall(id=f"c{i}", name="counted", arguments={"key": k}) for i in range(3)]
    with Dispatcher(TOOLS, settings=Settings(), limits=limits) as d:
        out: list[list[object]] = []
        runner = threading.Thread(target=lambda: out.append(d.run_turn_sync(calls, run_id="r-cancel")))
        runner.start()
        time.sleep(0.3)
        cancelled_at = time.monotonic()
        d.cancel("r-cancel")
        runner.join(timeout=5)
        elapsed = time.monotonic() - cancelled_at
    [results] = out
    assert [r.status for r in results] == ["cancelled"] * 5  # type: ignore[attr-defined]
    assert [r.attempts for r in results] == [1, 1, 0, 0, 0]  # type: ignore[attr-defined]
    assert RUNS[k + ":cancelled"] == 2
    assert RUNS[k] == 0  # the calls held back by the turn's cap never ran
    assert elapsed < 2


def test_a_concurrency_limit_holds_in_the_embedded_engine() -> None:
    from criogenai import Limits

    live, peak = [0], [0]
    lock = threading.Lock()

    @tool
    def busy() -> int:
        """Count how many run at once."""
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.1)
        with lock:
            live[0] -= 1
        return 0

    with Dispatcher([busy], settings=Settings(), limits=Limits(tool_concurrency={"busy": 2})) as d:
        results = d.run_turn_sync([ToolCall(id=f"b{i}", name="busy", arguments={}) for i in range(8)])
    assert [r.status for r in results] == ["ok"] * 8
    assert peak == [2]


def test_an_async_tool_run_through_await_run_turn_runs_on_the_callers_loop() -> None:
    # The Tools page: "async tools run on your event loop". A tool awaiting something the
    # application made on its loop (a future, a connection pool) must find itself on that loop.
    async def main() -> tuple[str, str]:
        app_loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = app_loop.create_future()

        @tool
        async def await_app_future() -> str:
            """Wait for the application's future."""
            assert asyncio.get_running_loop() is app_loop
            return await answer

        with Dispatcher([await_app_future], settings=Settings()) as d:
            call = ToolCall(id="c", name="await_app_future", arguments={})
            turn = asyncio.ensure_future(d.run_turn([call]))
            app_loop.call_later(0.05, answer.set_result, "from the app's loop")
            [r] = await turn
        return r.status, r.content

    assert asyncio.run(main()) == ("ok", "from the app's loop")


def test_the_embedded_engine_holds_1000_async_calls_at_once() -> None:
    # Given 1,000 calls of an async tool that each wait until all 1,000 are waiting
    waiting = 0
    all_in: asyncio.Event | None = None

    @tool
    async def gather_point() -> int:
        """Wait until every call of the turn is here."""
        nonlocal waiting
        assert all_in is not None
        waiting += 1
        if waiting == 1000:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 30)
        return waiting

    async def main() -> list[str]:
        nonlocal all_in
        all_in = asyncio.Event()
        limits = {"max_calls_per_turn": 1000, "max_calls_in_flight_per_turn": 1000}
        with Dispatcher([gather_point], settings=Settings(), limits=limits) as d:
            calls = [ToolCall(id=f"c{i}", name="gather_point", arguments={}) for i in range(1000)]
            return [r.status for r in await d.run_turn(calls)]

    # Then all of them are in flight at once, and every one ends ok
    assert asyncio.run(main()) == ["ok"] * 1000


def test_closing_a_dispatcher_returns_at_once() -> None:
    with Dispatcher([flaky], settings=Settings()) as d:
        d.run_turn_sync([ToolCall(id="c", name="flaky", arguments={"key": key(), "fail_times": 0})])
        started = time.monotonic()
    assert time.monotonic() - started < 0.25  # 50 ms measured alone; slack for a loaded CI machine


@tool
async def nap(seconds: float) -> float:
    """Sleep on the event loop."""
    await asyncio.sleep(seconds)
    return seconds


@tool
async def raises_cancelled() -> str:
    """Let a cancelled inner task's error escape, as careless async code does."""
    inner = asyncio.ensure_future(asyncio.sleep(10))
    inner.cancel()
    await inner
    return "never"


def test_calls_whose_callers_loop_closes_mid_turn_end_cancelled_not_failed() -> None:
    # Given a turn awaited on a loop that the application then shuts down mid-turn
    rid = key()
    calls = [ToolCall(id=f"c{i}", name="nap", arguments={"seconds": 5}) for i in range(4)]
    with Dispatcher([nap], settings=Settings()) as d:

        async def give_up() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(d.run_turn(calls, run_id=rid), 0.3)

        asyncio.run(give_up())
        # Then the calls are filed as cancelled (what re-dispatching the turn finds), never as a
        # tool's exception
        results = d.run_turn_sync(calls, run_id=rid)
    assert {r.status for r in results} == {"cancelled"}, results


def test_run_turn_sync_on_a_running_loop_refuses_instead_of_blocking_it() -> None:
    async def main() -> None:
        with Dispatcher([nap], settings=Settings()) as d:
            d.run_turn_sync([ToolCall(id="c", name="nap", arguments={"seconds": 0})])

    with pytest.raises(RuntimeError, match=r"run_turn_sync was called from a running event loop.*await"):
        asyncio.run(main())


def test_an_async_tools_own_cancelled_error_is_its_failure_not_a_timeout() -> None:
    with Dispatcher([raises_cancelled], settings=Settings()) as d:
        [r] = d.run_turn_sync([ToolCall(id="c", name="raises_cancelled", arguments={})])
    assert (r.status, r.artifact["exception"]["type"]) == ("exception", "CancelledError")


def test_turns_awaited_on_many_short_lived_loops_leave_no_loop_behind() -> None:
    with Dispatcher([nap], settings=Settings()) as d:
        for _ in range(50):
            [r] = asyncio.run(d.run_turn([ToolCall(id="c", name="nap", arguments={"seconds": 0})]))
            assert r.status == "ok"
        gc.collect()
        loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_closed()]
    assert len(loops) <= 2
