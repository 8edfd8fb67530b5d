"""The embedded engine gives what the fleet gives: a turn of every outcome, cancels, claims of
every kind and limits, run on both and compared (``runner._call`` says where they may differ)."""

from __future__ import annotations

import concurrent.futures
import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from criogenai import Dispatcher, Retry, Settings, ToolCall, ToolFailed, ToolResult
from criogenai.tools import Tool
from tests import fleet_tools
from tests.conftest import WorkerProcess, make_dispatcher, wait_for

TOOLS = [v for v in vars(fleet_tools).values() if isinstance(v, Tool)]
OPTIONS: dict[str, Any] = {
    "tool_retry": Retry(max_attempts=3, initial_backoff=0.05),
    "limits": {"tool_timeout_secs": 0.5, "max_result_chars": 1000},
}


def turn(k: str) -> list[ToolCall]:
    """Every status a worker can give, with counters of their own (``k``) for each engine."""
    args: list[tuple[str, dict[str, Any]]] = [
        ("echo", {"text": "hi"}),
        ("echo", {"text": 5}),
        ("launch_rocket", {}),
        ("flaky_read", {"key": k + "r", "fail_times": 2}),
        ("flaky_read", {"key": k + "g", "fail_times": 9}),
        ("flaky_write", {"key": k + "w", "fail_times": 1}),
        ("slow_first_read", {"key": k + "s", "seconds": 3}),
        ("sleep_for", {"seconds": 3}),
        ("async_sleep", {"seconds": 3}),
        ("boom", {"secret": "s3cr3t"}),
        ("not_json", {}),
        ("big", {"n": 5000}),
    ]
    return [ToolCall(id=f"c{i}", name=name, arguments=a) for i, (name, a) in enumerate(args)]


def seen(results: list[ToolResult]) -> list[tuple[Any, ...]]:
    """What the model and the run keep of each result, less what differs by process and time."""
    out = []
    for r in results:
        artifact = dict(r.artifact or {})
        if "exception" in artifact:
            exc = dict(artifact["exception"])  # type: ignore[arg-type]
            exc.pop("traceback")
            artifact["exception"] = exc
        out.append((r.call_id, r.name, r.status, r.content, r.attempts, r.truncated, artifact))
    return out


@pytest.mark.parametrize("policy", ["return_to_model", "return_generic", "fail"])
def test_a_turn_of_every_outcome_gives_the_same_results_embedded_and_on_the_fleet(
    fleet: WorkerProcess, policy: str
) -> None:
    by_engine = []
    for embedded in (False, True):
        k = uuid.uuid4().hex
        settings = Settings() if embedded else None
        d = (
            Dispatcher(TOOLS, settings=settings, on_tool_exception=policy, **OPTIONS)  # type: ignore[arg-type]
            if embedded
            else make_dispatcher(on_tool_exception=policy, **OPTIONS)
        )
        with d:  # type: ignore[attr-defined]
            if policy == "fail":
                with pytest.raises(ToolFailed) as info:
                    d.run_turn_sync(turn(k))  # type: ignore[attr-defined]
                results = info.value.results
            else:
                results = d.run_turn_sync(turn(k))  # type: ignore[attr-defined]
        by_engine.append(seen(results))
    fleet_results, embedded_results = by_engine
    assert embedded_results == fleet_results
    statuses = {r[2] for r in fleet_results}
    assert statuses == {"ok", "invalid_arguments", "unknown_tool", "tool_error", "timeout", "exception"}


# -- cancels, claims and limits: each scenario on both engines, the results compared ------------

Scenario = Callable[[Any, str], list[ToolResult]]
"""Runs one scenario with a dispatcher and a fresh counter key; returns what the model is given."""


def on_both_engines(scenario: Scenario, **options: Any) -> list[list[tuple[Any, ...]]]:
    """The scenario's results on the fleet, then embedded, as the model and the run see them
    (durations in texts replaced, as they differ by run)."""
    by_engine = []
    for embedded in (False, True):
        opts = {**OPTIONS, **options}
        d = Dispatcher(TOOLS, settings=Settings(), **opts) if embedded else make_dispatcher(**opts)
        with d:  # type: ignore[attr-defined]
            results = scenario(d, uuid.uuid4().hex)
        by_engine.append([
            (*row[:3], re.sub(r"\d+(\.\d+)? ?s\b", "N s", row[3]), *row[4:]) for row in seen(results)
        ])
    return by_engine


def test_a_turn_cancelled_while_its_calls_run_ends_the_same_on_both_engines(fleet: WorkerProcess) -> None:
    def scenario(d: Any, k: str) -> list[ToolResult]:
        rid = uuid.uuid4().hex
        calls = [ToolCall(id="sync", name="sleep_for", arguments={"seconds": 30, "key": k}),
                 ToolCall(id="async", name="async_sleep", arguments={"seconds": 30, "key": k + "a"})]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(d.run_turn_sync, calls, run_id=rid)
            wait_for(lambda: fleet_tools.runs(k) == 1, what="the sync call to start")
            d.cancel(rid)
            results: list[ToolResult] = running.result(timeout=30)
        wait_for(lambda: fleet_tools.runs(k + "a:cancelled") == 1, what="the async tool to see its cancel")
        return results

    fleet_results, embedded_results = on_both_engines(
        scenario, limits={**OPTIONS["limits"], "tool_timeout_secs": 60}
    )
    assert embedded_results == fleet_results
    assert [r[2] for r in fleet_results] == ["cancelled", "cancelled"]


def test_a_turn_cancelled_before_it_starts_runs_nothing_on_both_engines(fleet: WorkerProcess) -> None:
    """The claim says ``cancelled``: the call never runs, and is filed so on both engines."""

    def scenario(d: Any, k: str) -> list[ToolResult]:
        rid = uuid.uuid4().hex
        d.cancel(rid)
        results: list[ToolResult] = d.run_turn_sync(
            [ToolCall(id="c", name="sleep_for", arguments={"seconds": 1, "key": k})], run_id=rid
        )
        assert fleet_tools.runs(k) == 0, "a call of a cancelled turn ran"
        return results

    fleet_results, embedded_results = on_both_engines(scenario)
    assert embedded_results == fleet_results
    assert [r[2] for r in fleet_results] == ["cancelled"]


def test_a_finished_turn_sent_again_gives_its_filed_results_on_both_engines(fleet: WorkerProcess) -> None:
    """A run id sent again: what finished is answered from the ledger and runs no more."""

    def scenario(d: Any, k: str) -> list[ToolResult]:
        rid = uuid.uuid4().hex
        calls = [ToolCall(id="w", name="flaky_write", arguments={"key": k, "fail_times": 0}),
                 ToolCall(id="r", name="flaky_read", arguments={"key": k + "r", "fail_times": 1}),
                 ToolCall(id="e", name="boom", arguments={"secret": "s3cr3t"})]
        first = d.run_turn_sync(calls, run_id=rid)
        again: list[ToolResult] = d.run_turn_sync(calls, run_id=rid)
        assert seen(again) == seen(first)
        assert (fleet_tools.runs(k), fleet_tools.runs(k + "r")) == (1, 2), "a finished call ran again"
        return again

    fleet_results, embedded_results = on_both_engines(scenario)
    assert embedded_results == fleet_results
    assert [r[2] for r in fleet_results] == ["ok", "ok", "exception"]


def test_a_call_sent_twice_at_once_runs_once_and_both_get_its_result_on_both_engines(
    fleet: WorkerProcess,
) -> None:
    """The second delivery finds the call ``busy`` in the first's run and waits for its result."""

    def scenario(d: Any, k: str) -> list[ToolResult]:
        rid = uuid.uuid4().hex
        calls = [ToolCall(id="s", name="sleep_for", arguments={"seconds": 1.5, "key": k})]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(d.run_turn_sync, calls, run_id=rid)
            wait_for(lambda: fleet_tools.runs(k) == 1, what="the first delivery to start")
            second: list[ToolResult] = d.run_turn_sync(calls, run_id=rid)
            assert seen(first.result(timeout=30)) == seen(second)
        assert fleet_tools.runs(k) == 1, "the call ran twice"
        return second

    fleet_results, embedded_results = on_both_engines(
        scenario, limits={**OPTIONS["limits"], "tool_timeout_secs": 10}
    )
    assert [r[:3] for r in embedded_results] == [r[:3] for r in fleet_results] == [("s", "sleep_for", "ok")]


def test_a_call_waiting_behind_the_turns_cap_past_its_wait_is_not_started_on_both_engines(
    fleet: WorkerProcess,
) -> None:
    def scenario(d: Any, k: str) -> list[ToolResult]:
        calls = [ToolCall(id="first", name="async_sleep", arguments={"seconds": 2}),
                 ToolCall(id="behind", name="echo", arguments={"text": "late"})]
        results: list[ToolResult] = d.run_turn_sync(calls)
        return results

    limits = {**OPTIONS["limits"], "tool_timeout_secs": 5, "max_calls_in_flight_per_turn": 1,
              "queue_wait_secs": 0.5}
    fleet_results, embedded_results = on_both_engines(scenario, limits=limits)
    assert embedded_results == fleet_results
    assert [r[2] for r in fleet_results] == ["ok", "not_started"]
