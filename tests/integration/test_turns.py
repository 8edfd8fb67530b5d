"""Turns on a real fleet: a `criogenai worker` subprocess (prefork, then threads) on the real Redis."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from criogenai import Dispatcher, Limits, RemoteToolException, Retry, ToolCall, ToolFailed, ToolResult
from tests import fleet_tools
from tests.conftest import WorkerProcess, key, make_dispatcher


@pytest.fixture
def dispatcher(fleet: WorkerProcess) -> Dispatcher:
    d = make_dispatcher(tool_retry=Retry(max_attempts=3, initial_backoff=0.05))
    yield d
    d.close()


def test_results_come_back_one_per_call_in_call_order(dispatcher: Dispatcher) -> None:
    calls = [ToolCall(id=f"c{i}", name="echo", arguments={"text": f"t{i}"}) for i in range(8)]
    results = dispatcher.run_turn_sync(calls)
    assert [r.call_id for r in results] == [f"c{i}" for i in range(8)]
    assert [(r.status, r.content, r.attempts) for r in results] == [("ok", f"t{i}", 1) for i in range(8)]


def test_every_outcome_of_a_turn_reaches_the_model_as_its_status(dispatcher: Dispatcher) -> None:
    results = dispatcher.run_turn_sync([
        {"id": "ok", "name": "echo", "arguments": {"text": "hi"}},
        {"id": "bad", "name": "echo", "arguments": {"text": 5, "extra": 1}},
        {"id": "nope", "name": "launch_rocket", "arguments": {}},
        {"id": "err", "name": "flaky_write", "arguments": {"key": key(), "fail_times": 9}},
        {"id": "exc", "name": "boom", "arguments": {"secret": "s3cr3t"}},
        {"id": "nj", "name": "not_json", "arguments": {}},
    ])
    by_id = {r.call_id: r for r in results}
    assert by_id["ok"].status == "ok" and by_id["ok"].content == "hi"
    assert by_id["bad"].status == "invalid_arguments"
    assert "text: 5 is not of type 'string'" in by_id["bad"].content
    assert "'extra' was unexpected" in by_id["bad"].content
    assert by_id["nope"].status == "unknown_tool"
    assert "Available tools:" in by_id["nope"].content and "echo" in by_id["nope"].content
    assert by_id["err"].status == "tool_error" and by_id["err"].content == "not yet (1)"
    assert by_id["exc"].status == "exception"
    assert by_id["exc"].content == "RuntimeError: connection refused for password=s3cr3t"
    assert by_id["nj"].status == "exception" and "set" in by_id["nj"].content


def test_refused_calls_never_reach_a_worker(dispatcher: Dispatcher) -> None:
    k = key()
    results = dispatcher.run_turn_sync([
        {"id": "a", "name": "count", "arguments": {"key": k, "surplus": True}},
        {"id": "b", "name": "count", "arguments": {}},
    ])
    assert [r.status for r in results] == ["invalid_arguments", "invalid_arguments"]
    assert [r.attempts for r in results] == [0, 0]
    time.sleep(0.3)
    assert fleet_tools.runs(k) == 0


def test_a_turn_of_ten_one_second_calls_runs_concurrently(dispatcher: Dispatcher) -> None:
    calls = [ToolCall(id=f"s{i}", name="sleep_for", arguments={"seconds": 1.0}) for i in range(10)]
    started = time.monotonic()
    results = dispatcher.run_turn_sync(calls)
    elapsed = time.monotonic() - started
    assert all(r.status == "ok" for r in results), results
    assert elapsed < 3.0, f"10 calls of 1 s took {elapsed:.1f} s: they did not run concurrently"


def test_readonly_tool_is_retried_after_a_retryable_tool_error(dispatcher: Dispatcher) -> None:
    k = key()
    [r] = dispatcher.run_turn_sync([ToolCall(id="r", name="flaky_read",
                                             arguments={"key": k, "fail_times": 2})])
    assert (r.status, r.content, r.attempts) == ("ok", "ok after 3", 3)
    assert fleet_tools.runs(k) == 3


def test_readonly_tool_gives_up_after_max_attempts(dispatcher: Dispatcher) -> None:
    k = key()
    [r] = dispatcher.run_turn_sync([ToolCall(id="r", name="flaky_read",
                                             arguments={"key": k, "fail_times": 99})])
    assert (r.status, r.content, r.attempts) == ("tool_error", "not yet (3)", 3)
    assert fleet_tools.runs(k) == 3


def test_destructive_tool_is_never_retried(dispatcher: Dispatcher) -> None:
    k = key()
    [r] = dispatcher.run_turn_sync([ToolCall(id="w", name="flaky_write",
                                             arguments={"key": k, "fail_times": 1})])
    assert (r.status, r.attempts) == ("tool_error", 1)
    time.sleep(0.3)
    assert fleet_tools.runs(k) == 1


def test_readonly_tool_is_retried_after_timeout(fleet: WorkerProcess) -> None:
    k = key()
    with make_dispatcher(limits={"tool_timeout_secs": 0.5},
                         tool_retry=Retry(max_attempts=3, initial_backoff=0.05)) as d:
        [r] = d.run_turn_sync([ToolCall(id="t", name="slow_first_read",
                                        arguments={"key": k, "seconds": 3})])
    assert (r.status, r.content, r.attempts) == ("ok", "fast this time", 2)


def test_sync_and_async_tools_past_their_limit_time_out(fleet: WorkerProcess) -> None:
    k = key()
    with make_dispatcher(limits={"tool_timeout_secs": 0.5}) as d:
        started = time.monotonic()
        sync, asyn = d.run_turn_sync([
            ToolCall(id="s", name="sleep_for", arguments={"seconds": 5}),
            ToolCall(id="a", name="async_sleep", arguments={"seconds": 5, "key": k}),
        ])
        elapsed = time.monotonic() - started
    assert (sync.status, asyn.status) == ("timeout", "timeout")
    assert "did not finish within 0.5 s" in sync.content
    assert elapsed < 4.5
    assert fleet_tools.runs(k + ":cancelled") == 1, "the async tool was not cancelled"


def test_worker_keeps_serving_after_a_tool_ignores_its_soft_limit(fleet: WorkerProcess) -> None:
    with make_dispatcher(limits={"tool_timeout_secs": 0.5}) as d:
        [r] = d.run_turn_sync([ToolCall(id="st", name="stubborn", arguments={"seconds": 4})])
        assert r.status == "timeout"
        after = d.run_turn_sync([ToolCall(id=f"e{i}", name="echo", arguments={"text": "alive"})
                                 for i in range(10)])
    assert [x.content for x in after] == ["alive"] * 10


def test_return_generic_hides_the_exception_from_the_model(fleet: WorkerProcess) -> None:
    with make_dispatcher(on_tool_exception="return_generic") as d:
        [r] = d.run_turn_sync([ToolCall(id="x", name="boom", arguments={"secret": "hunter2"})])
    assert r.status == "exception"
    assert "hunter2" not in r.content and "RuntimeError" not in r.content
    # The text is kept in the artifact, with the run, for people (the Tools page's promise).
    assert r.artifact["exception"]["type"] == "RuntimeError"
    assert "hunter2" in r.artifact["exception"]["message"]


def test_fail_raises_tool_failed_with_the_remote_exception_as_cause(fleet: WorkerProcess) -> None:
    with make_dispatcher(on_tool_exception="fail") as d, pytest.raises(ToolFailed) as info:
        d.run_turn_sync([
            ToolCall(id="ok", name="echo", arguments={"text": "fine"}),
            ToolCall(id="x", name="boom", arguments={"secret": "pw"}),
        ])
    failed = info.value
    assert failed.code == "tool_failed" and failed.result.call_id == "x"
    assert [r.status for r in failed.results] == ["ok", "exception"]
    cause = failed.__cause__
    assert isinstance(cause, RemoteToolException)
    assert cause.type_name == "RuntimeError" and "password=pw" in cause.message
    assert "fleet_tools.py" in cause.traceback_text


def test_a_cut_result_is_marked_and_within_the_limit(dispatcher: Dispatcher) -> None:
    [r] = dispatcher.run_turn_sync([ToolCall(id="b", name="big", arguments={"n": 150_000})])
    assert r.status == "ok" and r.truncated
    assert len(r.content) == 100_000 and "cut: the result had 150,000 characters" in r.content


def test_run_turn_awaits_without_blocking_the_event_loop(dispatcher: Dispatcher) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    async def main() -> list[ToolResult]:
        t = asyncio.create_task(ticker())
        results = await dispatcher.run_turn([ToolCall(id="s", name="sleep_for", arguments={"seconds": 1})])
        t.cancel()
        return results

    results = asyncio.run(main())
    assert results[0].status == "ok"
    assert ticks >= 10, "the event loop was blocked while the turn ran"


def test_a_call_to_a_queue_with_no_worker_ends_not_started_within_seconds(fleet: WorkerProcess) -> None:
    with make_dispatcher(limits=Limits(no_worker_secs=1.0)) as d:
        started = time.monotonic()
        orphan, ok = d.run_turn_sync([ToolCall(id="o", name="orphan", arguments={}),
                                      ToolCall(id="e", name="echo", arguments={"text": "x"})])
        elapsed = time.monotonic() - started
    assert ok.status == "ok"
    assert orphan.status == "not_started"
    assert "no worker is serving queue 'nobody-serves-this'" in orphan.content
    assert elapsed < 5


def test_closing_the_dispatcher_ends_a_turn_still_waiting_for_its_calls(redis_up: None) -> None:
    import concurrent.futures

    d = make_dispatcher(limits=Limits(no_worker_secs=600, queue_wait_secs=600))
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        waiting = ex.submit(d.run_turn_sync, [ToolCall(id="o", name="orphan", arguments={})])
        time.sleep(0.5)
        d.close()
        [r] = waiting.result(timeout=15)
    assert r.status == "lost"
    assert "dispatcher was closed" in r.content


def test_context_carries_the_attempt_number_across_retries(dispatcher: Dispatcher) -> None:
    [r] = dispatcher.run_turn_sync([ToolCall(id="c", name="report_attempt",
                                             arguments={"key": key(), "fail_times": 2})], run_id="run-ctx")
    # The third run, under the same call id and run id (Celery retried the same task)
    assert (r.status, r.attempts) == ("ok", 3)
    assert json.loads(r.content) == {"attempt": 3, "call_id": "c", "run_id": "run-ctx"}


def test_closing_a_fleet_dispatcher_returns_at_once(fleet: WorkerProcess) -> None:
    d = make_dispatcher()
    [r] = d.run_turn_sync([ToolCall(id="c", name="echo", arguments={"text": "hi"})])
    assert r.status == "ok"
    started = time.monotonic()
    d.close()  # its gatherer was waiting on Redis for results that will not come
    assert time.monotonic() - started < 0.25  # 50 ms measured alone; slack for a loaded CI machine


def test_a_read_only_tool_killed_at_its_hard_limit_is_retried_like_any_timeout(fleet: WorkerProcess) -> None:
    # A tool that catches the soft limit on its first run outlives it and is killed at the hard limit
    # on prefork; on threads it is abandoned at its limit. Either way it timed out, so a read-only
    # tool runs again, and its second run ends ok.
    k = key()
    with make_dispatcher(tool_retry=Retry(max_attempts=2, initial_backoff=0.05)) as d:
        [r] = d.run_turn_sync([ToolCall(id="s", name="stubborn_once", arguments={"key": k})])
    assert (r.status, r.content, r.attempts) == ("ok", "second run", 2), r
    assert fleet_tools.runs(k) == 2
    # billiard reports a hard kill twice (the job's error and its timeout): the call is sent again once
    assert fleet.output().count("was killed at its hard limit") <= 1
