"""MCP servers' tools in ``tools=`` on the embedded engine, against servers nobody here wrote:
``@modelcontextprotocol/server-everything`` (npm) and ``mcp-server-time`` (PyPI), over stdio."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from criogenai import Dispatcher, MCPServerError, MCPServerStdio, MCPServerStreamableHTTP, Retry, ToolCall
from tests.conftest import wait_for
from tests.mcp_servers import everything_command, recorded_everything, sent, server_groups, time_command


def _official_listing(command: str, args: list[str]) -> list[Any]:
    """The server's tools as the official client lists them, to compare against."""

    async def main() -> list[Any]:
        async with Client(StdioServerParameters(command=command, args=args)) as client:
            return list((await client.list_tools()).tools)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Dispatcher, Path]]:
    """One server-everything for the module (its client's messages recorded) behind a dispatcher."""
    log = tmp_path_factory.mktemp("mcp") / "everything.jsonl"
    server = recorded_everything(log)
    with Dispatcher([server], tool_retry=Retry(max_attempts=1), limits={"tool_timeout_secs": 2}) as d:
        yield d, log
    server.close()


def _calls_named(log: Path, tool: str) -> list[dict[str, Any]]:
    return [m for m in sent(log) if m.get("method") == "tools/call" and m["params"]["name"] == tool]  # type: ignore[index]


def _cancelled_ids(log: Path) -> set[Any]:
    return {m["params"]["requestId"] for m in sent(log) if m.get("method") == "notifications/cancelled"}  # type: ignore[index]


def test_every_tool_of_server_everything_is_listed_with_its_schema_and_flags_from_its_annotations(
    everything: tuple[Dispatcher, Path],
) -> None:
    # Given the tools the official client lists
    d, _ = everything
    listed = _official_listing(everything_command(), ["stdio"])
    # Then each is a tool of the dispatcher, with the server's description, schema and hints
    assert sorted(t.name for t in listed) == d.registry.names()
    for mcp_tool in listed:
        ours = d.registry.get(mcp_tool.name)
        assert ours is not None
        assert ours.schema == mcp_tool.input_schema
        assert ours.description == (mcp_tool.description or "")
        hints = mcp_tool.annotations
        assert ours.read_only is bool(hints.read_only_hint)
        assert ours.idempotent is bool(hints.idempotent_hint)
        assert ours.destructive is (
            not (ours.read_only or ours.idempotent) and hints.destructive_hint is not False
        )
    # server-everything marks its readers read-only, and the toggles neither read-only nor idempotent
    assert d.registry.get("get-sum").retryable  # type: ignore[union-attr]
    assert not d.registry.get("toggle-simulated-logging").retryable  # type: ignore[union-attr]


def test_a_tool_without_annotations_is_destructive_and_never_retried() -> None:
    # Given the same server whose hints are not trusted (as a tool without annotations is read)
    server = MCPServerStdio(everything_command(), ["stdio"], trust_annotations=False, prefix="ev")
    try:
        tools = server.tools()
    finally:
        server.close()
    # Then every tool is destructive, never retried, and named with the prefix
    assert tools and all(t.destructive and not t.retryable for t in tools)
    assert all(t.name.startswith("ev_") for t in tools)


def test_valid_arguments_run_on_the_server_and_invalid_ones_never_reach_it(
    everything: tuple[Dispatcher, Path],
) -> None:
    d, log = everything
    ok, bad = d.run_turn_sync(
        [
            ToolCall(id="c1", name="get-sum", arguments={"a": 2, "b": 40}),
            ToolCall(id="c2", name="get-sum", arguments={"a": "two", "b": 40}),
        ]
    )
    assert (ok.status, ok.content) == ("ok", "The sum of 2 and 40 is 42.")
    assert bad.status == "invalid_arguments"
    assert "a: 'two' is not of type 'number'" in bad.content
    assert [c["params"]["arguments"] for c in _calls_named(log, "get-sum")] == [{"a": 2, "b": 40}]


def test_an_image_result_is_kept_in_the_artifact_and_the_model_reads_a_short_line(
    everything: tuple[Dispatcher, Path],
) -> None:
    d, _ = everything
    (r,) = d.run_turn_sync([ToolCall(id="c1", name="get-tiny-image", arguments={})])
    assert r.status == "ok"
    assert "[image image/png, about" in r.content and "mcp.content[0]" in r.content
    assert "iVBOR" not in r.content  # the picture's base64 is not sent to the model
    (image,) = r.artifact["mcp"]["content"]  # type: ignore[index]
    assert image["type"] == "image" and image["mimeType"] == "image/png"  # type: ignore[index]
    assert image["data"].startswith("iVBOR")  # type: ignore[index,union-attr]


def test_an_embedded_resource_is_kept_in_the_artifact_and_structured_content_is_json(
    everything: tuple[Dispatcher, Path],
) -> None:
    d, _ = everything
    res, structured = d.run_turn_sync(
        [
            ToolCall(
                id="c1", name="get-resource-reference", arguments={"resourceType": "Text", "resourceId": 2}
            ),
            ToolCall(id="c2", name="get-structured-content", arguments={"location": "New York"}),
        ]
    )
    assert res.status == "ok"
    assert (
        "[resource demo://resource/dynamic/text/2 (text/plain): kept in the result's artifact" in res.content
    )
    (kept,) = res.artifact["mcp"]["content"]  # type: ignore[index]
    assert kept["resource"]["uri"] == "demo://resource/dynamic/text/2"  # type: ignore[index]
    assert structured.status == "ok"
    assert set(json.loads(structured.content)) == {"temperature", "conditions", "humidity"}


def test_a_call_past_its_time_limit_ends_timeout_and_is_cancelled_on_the_server(
    everything: tuple[Dispatcher, Path],
) -> None:
    d, log = everything
    (r,) = d.run_turn_sync(
        [ToolCall(id="c1", name="trigger-long-running-operation", arguments={"duration": 30, "steps": 3})]
    )
    assert r.status == "timeout" and r.attempts == 1
    (call,) = _calls_named(log, "trigger-long-running-operation")
    wait_for(lambda: call["id"] in _cancelled_ids(log), 5, "notifications/cancelled for the call")


def test_dispatcher_cancel_ends_the_call_cancelled_and_cancels_it_on_the_server(
    everything: tuple[Dispatcher, Path],
) -> None:
    d, log = everything
    sent_before = len(_calls_named(log, "trigger-long-running-operation"))
    call = ToolCall(id="c1", name="trigger-long-running-operation", arguments={"duration": 20, "steps": 2})
    results: list[Any] = []
    turn = threading.Thread(target=lambda: results.extend(d.run_turn_sync([call], run_id="mcp-cancel-run")))
    turn.start()
    wait_for(
        lambda: len(_calls_named(log, "trigger-long-running-operation")) > sent_before, 10, "the call sent"
    )
    d.cancel("mcp-cancel-run")
    turn.join(15)
    assert [r.status for r in results] == ["cancelled"]
    sent_call = _calls_named(log, "trigger-long-running-operation")[-1]
    wait_for(lambda: sent_call["id"] in _cancelled_ids(log), 5, "notifications/cancelled for the call")


def test_a_server_killed_mid_call_gives_a_clear_exception_and_the_next_call_a_new_server(
    tmp_path: Path,
) -> None:
    log = tmp_path / "killed.jsonl"
    server = recorded_everything(log)
    with Dispatcher([server], tool_retry=Retry(max_attempts=1), limits={"tool_timeout_secs": 20}) as d:
        first = server_groups(log)
        results: list[Any] = []
        call = ToolCall(
            id="c1", name="trigger-long-running-operation", arguments={"duration": 15, "steps": 3}
        )
        turn = threading.Thread(target=lambda: results.extend(d.run_turn_sync([call])))
        turn.start()
        wait_for(lambda: _calls_named(log, "trigger-long-running-operation"), 10, "the call sent")
        for group in first:
            os.killpg(group, signal.SIGKILL)
        turn.join(15)
        # The call ends at once with a text that says what happened
        (r,) = results
        assert r.status == "exception"
        assert "MCPServerError" in r.content and "closed the connection during the call" in r.content
        # The next call starts the server again and runs
        (again,) = d.run_turn_sync([ToolCall(id="c2", name="get-sum", arguments={"a": 1, "b": 1})])
        assert (again.status, again.content) == ("ok", "The sum of 1 and 1 is 2.")
        assert server_groups(log) and not set(server_groups(log)) & set(first)
    server.close()


def test_a_server_that_never_answers_or_exits_at_start_is_refused_with_a_clear_error() -> None:
    hung = MCPServerStdio("sleep", ["30"], connect_timeout_secs=1)
    with pytest.raises(MCPServerError, match="did not finish starting within 1 s"):
        Dispatcher([hung])
    gone = MCPServerStdio("false", connect_timeout_secs=5)
    with pytest.raises(MCPServerError, match="MCP server false could not be started"):
        Dispatcher([gone])


def test_mcp_server_time_from_pypi_answers_and_its_errors_are_tool_errors() -> None:
    server = MCPServerStdio(time_command(), name="time")
    with Dispatcher([server]) as d:
        tool = d.registry.get("get_current_time")
        assert tool is not None and tool.read_only and tool.idempotent
        ok, bad_zone, missing = d.run_turn_sync(
            [
                ToolCall(id="c1", name="get_current_time", arguments={"timezone": "UTC"}),
                ToolCall(id="c2", name="get_current_time", arguments={"timezone": "Mars/Olympus"}),
                ToolCall(id="c3", name="convert_time", arguments={"time": "10:00"}),
            ]
        )
    server.close()
    assert ok.status == "ok" and '"timezone": "UTC"' in ok.content
    assert bad_zone.status == "tool_error" and "Invalid timezone" in bad_zone.content
    assert missing.status == "invalid_arguments" and "source_timezone" in missing.content


def test_the_readme_example_runs() -> None:
    import subprocess
    import sys

    from tests.conftest import PYTHONPATH, ROOT

    out = subprocess.run(
        [sys.executable, "examples/mcp_time.py"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "True True False"
    assert out[1].startswith('c1 ok {"timezone": "Europe/Lisbon"')
    assert out[2].startswith("c2 tool_error Error executing tool get_current_time: Invalid timezone")
    assert out[3] == "c3 ok Hello, Ana!"


def test_streamable_http_server_everything_on_a_loopback_port(tmp_path: Path) -> None:
    import socket
    import subprocess

    # Given server-everything in its streamable HTTP mode on a port of the test's choosing
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = tmp_path / "http.log"
    with err.open("wb") as out:
        proc = subprocess.Popen(
            [everything_command(), "streamableHttp"],
            env={**os.environ, "PORT": str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: f"listening on port {port}" in err.read_text(), 20, "the HTTP server")
        secret = "Bearer s3cret-token-value"
        server = MCPServerStreamableHTTP(f"http://127.0.0.1:{port}/mcp", headers={"Authorization": secret})
        assert secret not in repr(server) and "s3cret" not in server.name
        with (
            server,
            Dispatcher([server], tool_retry=Retry(max_attempts=1), limits={"tool_timeout_secs": 3}) as d,
        ):
            assert "get-sum" in d.registry and "trigger-long-running-operation" in d.registry
            ok, bad, slow = d.run_turn_sync(
                [
                    ToolCall(id="c1", name="get-sum", arguments={"a": 5, "b": 6}),
                    ToolCall(id="c2", name="get-sum", arguments={"a": 5}),
                    ToolCall(
                        id="c3", name="trigger-long-running-operation", arguments={"duration": 20, "steps": 2}
                    ),
                ]
            )
        assert (ok.status, ok.content) == ("ok", "The sum of 5 and 6 is 11.")
        assert bad.status == "invalid_arguments"
        assert slow.status == "timeout"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
