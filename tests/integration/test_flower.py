"""Flower, as operators run it, shows a failed call as failed, with neither arguments nor error text."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest

from criogenai import CallFailed, Settings, ToolCall, task_id
from criogenai.worker import create_app
from tests.conftest import ROOT, fleet_url, key, make_dispatcher, wait_for

AUTH = "ops:flower-test-password"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str, auth: str | None = AUTH) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except OSError:
        return 0, None


@pytest.fixture
def flower(tmp_path, redis_up):  # type: ignore[no-untyped-def]
    """Flower 2 on a loopback port, with basic auth from the environment (FLOWER_BASIC_AUTH)."""
    port = _free_port()
    env = {**os.environ, "FLOWER_BASIC_AUTH": AUTH}
    log = tmp_path / "flower.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", f"--broker={fleet_url()}", "flower", f"--port={port}",
             "--address=127.0.0.1"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _get(port, "/api/workers")[0] == 200, timeout=30,
                 what=f"Flower to answer: {log.read_text()[-2000:] if log.exists() else ''}")
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def test_flower_shows_a_failed_call_as_failed_without_arguments_or_error_text(worker_factory, flower) -> None:  # type: ignore[no-untyped-def]
    # Given a worker sending task events, watched by Flower
    # Celery's result records too, for the stock AsyncResult below
    worker_factory(pool="threads", concurrency=4, queues="criogenai", extra_args=("--events",),
                   extra_env={"CRIOGENAI_CELERY_RESULT_RECORDS": "1"})
    # When a turn has a call that succeeds, a ToolError and an exception holding a secret
    run_id = f"flower-{key()}"
    with make_dispatcher(on_tool_exception="return_generic") as d:
        results = d.run_turn_sync([
            ToolCall(id="ok", name="echo", arguments={"text": "fine"}),
            ToolCall(id="err", name="flaky_write", arguments={"key": key(), "fail_times": 5}),
            ToolCall(id="exc", name="boom", arguments={"secret": "s3cr3t-in-args"}),
        ], run_id=run_id)
    assert [r.status for r in results] == ["ok", "tool_error", "exception"]
    ids = {call: task_id(run_id, call) for call in ("ok", "err", "exc")}

    # Then Flower's API shows the failures as FAILURE and the success as SUCCESS
    tasks: dict[str, Any] = {}

    def seen() -> bool:
        tasks.update({tid: _get(flower, f"/api/task/info/{tid}")[1] for tid in ids.values()})
        return all(t and t.get("state") in ("SUCCESS", "FAILURE") for t in tasks.values())

    wait_for(seen, timeout=30, what="Flower to see the three tasks")
    state = {call: tasks[tid]["state"] for call, tid in ids.items()}
    assert state == {"ok": "SUCCESS", "err": "FAILURE", "exc": "FAILURE"}
    for call, tool in (("err", "flaky_write"), ("exc", "boom")):
        info = tasks[ids[call]]
        assert info["name"] == f"tool:{tool}"
        assert "CallFailed" in info["exception"] and call in info["exception"]
        # And no arguments, no error text anywhere in what Flower shows
        text = json.dumps(info)
        assert "s3cr3t" not in text and "password" not in text and "not yet" not in text
        assert info["args"] == "()" and "arguments" not in info["kwargs"]
    assert "tool_error" in tasks[ids["err"]]["exception"]
    assert "exception" in tasks[ids["exc"]]["exception"]
    # And Flower refuses its API without the credentials
    assert _get(flower, "/api/workers", auth=None)[0] == 401

    # And a stock AsyncResult raises CallFailed for a failed call, and returns an ok one's result
    app = create_app(Settings(broker_url=fleet_url()))
    assert app.AsyncResult(ids["ok"]).get(timeout=5)["content"] == "fine"
    with pytest.raises(CallFailed) as failed:
        app.AsyncResult(ids["exc"]).get(timeout=5)
    assert (failed.value.status, failed.value.tool, failed.value.call_id) == ("exception", "boom", "exc")
