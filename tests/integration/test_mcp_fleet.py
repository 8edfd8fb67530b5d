"""An MCP server's tools on a real fleet: a worker serving server-everything (npm) holds the
session, publishes the tools in the catalog, and an agent process uses them without the server."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from criogenai import Dispatcher, Retry, Settings, ToolCall, ToolRegistry
from tests.conftest import WorkerProcess, fleet_url, start_worker, wait_for
from tests.mcp_servers import sent, server_groups

NAMES = ["get-sum", "get-tiny-image", "trigger-long-running-operation"]


@pytest.fixture(scope="module", params=["prefork", "threads"])
def mcp_worker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_up: None
) -> Iterator[tuple[WorkerProcess, Path]]:
    redis.Redis.from_url(fleet_url()).flushdb()
    tmp = tmp_path_factory.mktemp("mcp-fleet")
    log = tmp / "everything.jsonl"
    w = start_worker(
        fleet_url(),
        tmp,
        pool=request.param,
        concurrency=2,
        tools="tests.mcp_fleet_tools",
        extra_env={"CRIOGENAI_TEST_MCP_LOG": str(log)},
    )
    yield w, log
    w.stop()


@pytest.fixture
def agent(mcp_worker: tuple[WorkerProcess, Path]) -> Iterator[Dispatcher]:
    """An agent process's dispatcher: tools from the catalog, no server started here."""
    settings = Settings(broker_url=fleet_url(), lease_secs=2.0)
    registry = ToolRegistry.from_catalog(NAMES, settings)
    with Dispatcher(
        registry, settings=settings, tool_retry=Retry(max_attempts=1), limits={"tool_timeout_secs": 5}
    ) as d:
        yield d


def _calls(log: Path, tool: str) -> list[dict[str, Any]]:
    return [m for m in sent(log) if m.get("method") == "tools/call" and m["params"]["name"] == tool]  # type: ignore[index]


def test_the_worker_publishes_the_servers_tools_with_their_schemas_and_flags(
    mcp_worker: tuple[WorkerProcess, Path], agent: Dispatcher
) -> None:
    get_sum = agent.registry.get("get-sum")
    assert get_sum is not None and get_sum.read_only and get_sum.idempotent
    assert get_sum.schema["properties"].keys() == {"a", "b"}
    assert get_sum.schema["$schema"] == "http://json-schema.org/draft-07/schema#"


def test_calls_run_on_the_workers_session_with_results_and_artifacts_back_in_the_agent(
    mcp_worker: tuple[WorkerProcess, Path], agent: Dispatcher
) -> None:
    _, log = mcp_worker
    ok, bad, image = agent.run_turn_sync(
        [
            ToolCall(id="c1", name="get-sum", arguments={"a": 20, "b": 22}),
            ToolCall(id="c2", name="get-sum", arguments={"a": 20}),
            ToolCall(id="c3", name="get-tiny-image", arguments={}),
        ]
    )
    assert (ok.status, ok.content) == ("ok", "The sum of 20 and 22 is 42.")
    assert bad.status == "invalid_arguments" and "'b' is a required property" in bad.content
    assert image.status == "ok" and image.artifact["mcp"]["content"][0]["mimeType"] == "image/png"  # type: ignore[index]
    assert [c["params"]["arguments"] for c in _calls(log, "get-sum")][-1] == {"a": 20, "b": 22}


def test_a_call_past_its_limit_on_a_worker_ends_timeout_and_is_cancelled_on_the_server(
    mcp_worker: tuple[WorkerProcess, Path], agent: Dispatcher
) -> None:
    _, log = mcp_worker
    (r,) = agent.run_turn_sync(
        [ToolCall(id="c1", name="trigger-long-running-operation", arguments={"duration": 30, "steps": 3})]
    )
    assert r.status == "timeout" and r.attempts == 1
    call = _calls(log, "trigger-long-running-operation")[-1]
    wait_for(
        lambda: any(
            m.get("method") == "notifications/cancelled" and m["params"]["requestId"] == call["id"]  # type: ignore[index]
            for m in sent(log)
        ),
        5,
        "notifications/cancelled for the call",
    )


def test_a_server_killed_mid_call_on_a_worker_gives_an_exception_and_the_next_call_a_new_server(
    mcp_worker: tuple[WorkerProcess, Path], agent: Dispatcher
) -> None:
    _, log = mcp_worker
    agent.run_turn_sync([ToolCall(id="c0", name="get-sum", arguments={"a": 0, "b": 0})])  # a session is up
    sent_before = len(_calls(log, "trigger-long-running-operation"))
    results: list[Any] = []
    call = ToolCall(id="c1", name="trigger-long-running-operation", arguments={"duration": 4.5, "steps": 1})
    turn = threading.Thread(target=lambda: results.extend(agent.run_turn_sync([call])))
    turn.start()
    wait_for(lambda: len(_calls(log, "trigger-long-running-operation")) > sent_before, 10, "the call sent")
    groups = server_groups(log)
    for group in groups:  # every pool process's server
        os.killpg(group, signal.SIGKILL)
    turn.join(15)
    (r,) = results
    assert r.status == "exception" and "closed the connection during the call" in r.content
    # The next call in each worker process starts a new session: on prefork the other child (2
    # slots) learns its server is gone on its own next call, with the same clear text.
    for attempt in range(2):
        sum_call = ToolCall(id=f"c2-{attempt}", name="get-sum", arguments={"a": 1, "b": 2})
        (again,) = agent.run_turn_sync([sum_call])
        if again.status == "ok":
            break
        assert again.status == "exception" and "the next call starts a new session" in again.content
    assert (again.status, again.content) == ("ok", "The sum of 1 and 2 is 3.")
    assert server_groups(log) and not set(server_groups(log)) & set(groups)
