"""Both worker commands take Celery's whole worker CLI and every criogenai setting at once.

``criogenai worker`` hands options it does not know to Celery's worker; ``celery -A criogenai.worker
worker`` gets criogenai's options and ``CRIOGENAI_*`` settings through the same ``celeryd_init`` hook.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import redis

from criogenai import ToolCall
from tests.conftest import (
    PYTHONPATH,
    ROOT,
    WorkerProcess,
    fleet_url,
    key,
    make_dispatcher,
    wait_for,
    wait_until_live,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_criogenai_worker_passes_celerys_own_worker_options_through(worker_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given `criogenai worker` with options only Celery's worker knows
    pidfile = tmp_path / "worker.pid"
    w = worker_factory(
        pool="prefork", concurrency=1, queues="criogenai",
        extra_args=("--max-tasks-per-child", "1", "-O", "fair", "--prefetch-multiplier", "1",
                    "--pidfile", str(pidfile)),
    )
    # When two calls run one after the other
    with make_dispatcher() as d:
        first = d.run_turn_sync([ToolCall(id="a", name="count", arguments={"key": key()})])[0]
        second = d.run_turn_sync([ToolCall(id="b", name="count", arguments={"key": key()})])[0]
    # Then Celery applied them: a fresh pool child per call, and the pid file names the worker
    assert (first.status, second.status) == ("ok", "ok"), (first, second)
    assert json.loads(first.content)["pid"] != json.loads(second.content)["pid"]
    assert int(pidfile.read_text().strip()) == w.proc.pid


def test_celery_A_worker_honours_every_criogenai_setting(redis_up, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a stock `celery -A criogenai.worker worker` (no -Q), with criogenai's settings in the
    # environment only
    redis.Redis.from_url(fleet_url()).delete("crg:workers:fleet-gpu")
    port, spans = _free_port(), tmp_path / "spans.jsonl"
    name = f"celery-a-{key()[:6]}@test"
    env = {**os.environ, "CRIOGENAI_BROKER_URL": fleet_url(), "CRIOGENAI_TOOLS": "tests.fleet_tools",
           "CRIOGENAI_TEST_COUNTER_URL": fleet_url(), "PYTHONPATH": PYTHONPATH,
           "CRIOGENAI_METRICS_PORT": str(port), "CRIOGENAI_LOG_FORMAT": "json",
           "CRIOGENAI_OTEL": "1", "CRIOGENAI_OTEL_SPANS_FILE": str(spans), "OTEL_TRACES_EXPORTER": "none"}
    env.pop("CRIOGENAI_QUEUES", None)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "criogenai.worker", "worker", "--pool", "prefork",
             "-c", "2", "-n", name, "-l", "INFO", "--without-gossip", "--without-mingle"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    worker = WorkerProcess(name, proc, log)
    try:
        wait_until_live(fleet_url(), name, worker)
        # When a turn calls a tool of the default queue and a @tool(queue="fleet-gpu") one
        with make_dispatcher() as d:
            results = d.run_turn_sync([ToolCall(id="a", name="echo", arguments={"text": "hi"}),
                                       ToolCall(id="g", name="where_gpu", arguments={})])
        # Then both run: the worker consumes every queue of its tools
        assert [r.status for r in results] == ["ok", "ok"], results
        # And the metrics endpoint, on loopback, counts them
        def counted() -> bool:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            return 'criogenai_calls_total{status="ok",tool="where_gpu"} 1.0' in text
        wait_for(counted, what="the gpu call in the metrics")
        # And each call is traced
        wait_for(lambda: spans.exists() and spans.read_text().count("\n") >= 2, what="two spans")
        # And every line the worker wrote is JSON (no banner)
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        assert lines and all(json.loads(line)["level"] for line in lines), lines[:5]
        assert any(json.loads(line).get("tool") == "where_gpu" for line in lines)
    finally:
        worker.stop()


def test_celery_A_worker_serves_the_queues_named_in_criogenai_queues(redis_up, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given `celery -A criogenai.worker worker` with CRIOGENAI_QUEUES=fleet-gpu
    client = redis.Redis.from_url(fleet_url())
    name = f"celery-q-{key()[:6]}@test"
    env = {**os.environ, "CRIOGENAI_BROKER_URL": fleet_url(), "CRIOGENAI_TOOLS": "tests.fleet_tools",
           "CRIOGENAI_QUEUES": "fleet-gpu", "PYTHONPATH": PYTHONPATH}
    log = tmp_path / "worker.log"
    with Path(log).open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "criogenai.worker", "worker", "--pool", "threads",
             "-c", "1", "-n", name, "--without-gossip", "--without-mingle"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    worker = WorkerProcess(name, proc, log)
    try:
        wait_until_live(fleet_url(), name, worker)
        # Then it consumes that queue and no other
        assert client.zscore("crg:workers:fleet-gpu", name) is not None
        assert client.zscore("crg:workers:criogenai", name) is None
    finally:
        worker.stop()
