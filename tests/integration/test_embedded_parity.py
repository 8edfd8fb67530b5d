"""The embedded engine gives what the fleet gives: one turn of every outcome on both, compared."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from criogenai import Dispatcher, Retry, Settings, ToolCall, ToolFailed, ToolResult
from criogenai.tools import Tool
from tests import fleet_tools
from tests.conftest import WorkerProcess, make_dispatcher

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
