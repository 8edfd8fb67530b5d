"""``criogenai mcp serve``: the fleet's tools to MCP clients nobody here wrote.

A real worker (threads pool) serves ``tests.mcp_serve_tools``; ``criogenai mcp serve`` runs as a
subprocess, over stdio (started by the client) and over streamable HTTP on a loopback port with a
bearer token; the official ``mcp`` client and the MCP Inspector's CLI (npm) list and call the tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from criogenai import Approvals, Settings
from criogenai._cli import main
from tests.conftest import PYTHONPATH, ROOT, WorkerProcess, fleet_url, start_worker, wait_for

INSPECTOR_PKG = ROOT / "tests" / "node" / "node_modules" / "@modelcontextprotocol" / "inspector-cli"
INSPECTOR = ROOT / "tests" / "node" / "node_modules" / ".bin" / "mcp-inspector-cli"
SERVE = ["-m", "criogenai", "mcp", "serve", "--approve", "send_message", "-l", "INFO"]
NAMES = ["get_lab_result", "refund_order", "schedule_visit", "send_message"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "CRIOGENAI_BROKER_URL": fleet_url(), "PYTHONPATH": PYTHONPATH, **extra}


@pytest.fixture(scope="module")
def fleet_worker(tmp_path_factory: pytest.TempPathFactory, redis_up: None) -> Iterator[WorkerProcess]:
    redis.Redis.from_url(fleet_url()).flushdb()
    w = start_worker(fleet_url(), tmp_path_factory.mktemp("mcp-serve"), pool="threads",
                     tools="tests.mcp_serve_tools")
    yield w
    w.stop()


@dataclass
class HttpServe:
    url: str
    token: str
    log: Path
    proc: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def http_serve(fleet_worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServe]:
    """``criogenai mcp serve --transport http`` on a free loopback port, the token from the env."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_urlsafe(24)
    log = tmp_path_factory.mktemp("mcp-serve-http") / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *SERVE, "--transport", "http", "--port", str(port)],
            cwd=ROOT, env=_env(CRIOGENAI_MCP_TOKEN=token), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/mcp"
    wait_for(lambda: _status(url, None) == 401 or proc.poll() is not None, 30, "mcp serve listening")
    assert proc.poll() is None, log.read_text()
    yield HttpServe(url, token, log, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(10)


def _status(url: str, token: str | None) -> int | None:
    """The HTTP status of an MCP initialize POST, None when nothing listens yet."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@contextlib.asynccontextmanager
async def _http_client(serve: HttpServe, token: str | None) -> AsyncIterator[Client]:
    """The official client over streamable HTTP; the SDK leaves closing an HTTP client it was
    given to its owner."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=None)) as http,
        Client(streamable_http_client(serve.url, http_client=http)) as client,
    ):
        yield client


async def _list_and_call(connect: contextlib.AbstractAsyncContextManager[Client]) -> dict[str, Any]:
    async with connect as client:
        listed = await client.list_tools()
        ok = await client.call_tool("get_lab_result", {"test_id": "LAB-12345"})
        bad = await client.call_tool("get_lab_result", {"test_id": "12345", "colour": "red"})
        failed = await client.call_tool("refund_order", {"order": "A-1"})
        return {"tools": {t.name: t for t in listed.tools}, "ok": ok, "bad": bad, "failed": failed}


def _check_list_and_calls(seen: dict[str, Any]) -> None:
    tools = seen["tools"]
    assert sorted(tools) == NAMES
    hints = {n: t.annotations.model_dump(by_alias=True, exclude_none=True) for n, t in tools.items()}
    assert hints == {
        "get_lab_result": {"readOnlyHint": True},
        "schedule_visit": {"readOnlyHint": False, "idempotentHint": True},
        "send_message": {"readOnlyHint": False, "destructiveHint": True},
        "refund_order": {"readOnlyHint": False},  # MCP's default for destructiveHint (true) applies
    }
    assert tools["get_lab_result"].input_schema["properties"]["test_id"]["pattern"] == r"^LAB-\d{5}$"
    ok, bad, failed = seen["ok"], seen["bad"], seen["failed"]
    assert not ok.is_error
    assert ok.structured_content == {"test_id": "LAB-12345", "status": "final", "hba1c": 5.4}
    assert json.loads(ok.content[0].text) == ok.structured_content
    assert ok.meta["criogenai/status"] == "ok" and len(ok.meta["criogenai/run_id"]) == 32
    # Invalid arguments: a tool result with isError, every problem in the text the client shows
    assert bad.is_error and bad.meta["criogenai/status"] == "invalid_arguments"
    assert "'12345' does not match" in bad.content[0].text and "colour" in bad.content[0].text
    assert failed.is_error and failed.content[0].text == "order A-1 was never paid"


def test_the_official_client_over_stdio_lists_the_fleets_tools_and_calls_them_on_the_worker(
    fleet_worker: WorkerProcess,
) -> None:
    # Given mcp serve started by the official client as its stdio server
    params = StdioServerParameters(command=sys.executable, args=SERVE, env=_env(), cwd=str(ROOT))
    # When it lists the tools and calls one with valid and one with invalid arguments
    seen = asyncio.run(_list_and_call(Client(params)))
    # Then the tools are the worker's, with hints from their flags, and results come back mapped
    _check_list_and_calls(seen)


def test_the_official_client_over_http_with_the_token_lists_and_calls_the_tools(
    http_serve: HttpServe,
) -> None:
    seen = asyncio.run(_list_and_call(_http_client(http_serve, http_serve.token)))
    _check_list_and_calls(seen)


def test_http_refuses_requests_without_the_token_or_with_another_and_never_logs_it(
    http_serve: HttpServe,
) -> None:
    # Given the server's token in its environment
    # Then requests without it, or with another, are refused before any MCP handling
    assert _status(http_serve.url, None) == 401
    assert _status(http_serve.url, "x" * len(http_serve.token)) == 401
    assert _status(http_serve.url, http_serve.token) == 200
    # And the official client without it cannot connect
    with pytest.raises(ExceptionGroup) as caught:
        asyncio.run(_list_and_call(_http_client(http_serve, None)))
    assert caught.group_contains(MCPError, match="error response", depth=2)
    # And the token is nowhere in the server's output
    assert http_serve.token not in http_serve.log.read_text()


def test_http_without_a_token_is_refused_on_an_address_other_than_loopback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given no token, a bind to every interface
    monkeypatch.setenv("CRIOGENAI_BROKER_URL", fleet_url())
    monkeypatch.delenv("CRIOGENAI_MCP_TOKEN", raising=False)
    # Then the server does not start, and says what to set; a short token is refused too
    assert main(["mcp", "serve", "--transport", "http", "--host", "0.0.0.0"]) == 2
    assert "needs a bearer token: set $CRIOGENAI_MCP_TOKEN" in capsys.readouterr().err
    assert main(["mcp", "serve", "--transport", "http", "--host", "0.0.0.0", "--token", "short"]) == 2
    assert "at least 16 characters" in capsys.readouterr().err


def test_a_call_that_needs_approval_waits_naming_its_run_and_resumes_once_approved(
    http_serve: HttpServe,
) -> None:
    async def call(meta: dict[str, Any] | None = None) -> Any:
        async with _http_client(http_serve, http_serve.token) as client:
            return await client.call_tool("send_message", {"patient_ref": "P-1", "text": "Hi"}, meta=meta)  # type: ignore[arg-type]

    # Given send_message needs approval
    waiting = asyncio.run(call())
    run_id, call_id = waiting.meta["criogenai/run_id"], waiting.meta["criogenai/call_id"]
    # Then the call has not run, and the result names the run and the call
    assert not waiting.is_error and waiting.meta["criogenai/status"] == "pending_approval"
    assert f"Waiting for approval: run {run_id}, call {call_id}" in waiting.content[0].text
    # When a person approves it, and the client calls again naming the run
    Approvals(Settings(broker_url=fleet_url())).approve(run_id, call_id, by="ana")
    done = asyncio.run(call({"criogenai/run_id": run_id}))
    # Then it ran on the worker
    assert (done.is_error, done.content[0].text) == (False, "sent to P-1: Hi")


def _inspector(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The MCP Inspector's CLI (npm). It reads its package.json relative to the working directory
    but imports it relative to itself; from its build directory both agree."""
    assert INSPECTOR.exists(), f"{INSPECTOR} is missing: run `make setup` (npm ci in tests/node)"
    return subprocess.run(
        [str(INSPECTOR), "--cli", *args], cwd=INSPECTOR_PKG / "build", env=env or _env(),
        capture_output=True, text=True, timeout=90,
    )


def test_the_mcp_inspector_cli_lists_the_tools_over_stdio(fleet_worker: WorkerProcess) -> None:
    out = _inspector(sys.executable, *SERVE, "--method", "tools/list")
    assert out.returncode == 0, out.stderr
    tools = {t["name"]: t for t in json.loads(out.stdout)["tools"]}
    assert sorted(tools) == NAMES
    assert tools["schedule_visit"]["annotations"] == {"readOnlyHint": False, "idempotentHint": True}


def test_the_mcp_inspector_cli_calls_the_tools_over_http_and_shows_invalid_arguments_as_errors(
    http_serve: HttpServe,
) -> None:
    auth = ("--transport", "http", "--header", f"Authorization: Bearer {http_serve.token}")
    ok = _inspector(http_serve.url, *auth, "--method", "tools/call", "--tool-name", "schedule_visit",
                    "--tool-arg", "patient_ref=P-1", "slot=2026-12-03T09:00")
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["content"] == [{"type": "text", "text": "booked P-1 at 2026-12-03T09:00"}]
    assert not result.get("isError")
    bad = _inspector(http_serve.url, *auth, "--method", "tools/call", "--tool-name", "schedule_visit",
                     "--tool-arg", "patient_ref=P-1")
    assert bad.returncode == 0, bad.stderr
    shown = json.loads(bad.stdout)
    assert shown["isError"] is True and "'slot' is a required property" in shown["content"][0]["text"]
    # Without the token the Inspector is refused too
    refused = _inspector(http_serve.url, "--transport", "http", "--method", "tools/list")
    assert refused.returncode != 0 and "Authentication required" in refused.stderr
