"""Running the fleet: compose file, tool catalog, routing, large results, logs, metrics, scale-out.

Every test starts real ``criogenai worker`` subprocesses on the real Redis (the test database).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from criogenai import Catalog, ConfigurationError, Dispatcher, Limits, Settings, ToolCall, ToolRegistry
from tests.conftest import PYTHONPATH, ROOT, WorkerProcess, fleet_url, make_dispatcher

Factory = Callable[..., WorkerProcess]


@pytest.fixture
def clean(redis_up: None) -> Iterator[None]:
    """An empty test database: no catalog records or worker beats left by earlier tests."""
    redis.Redis.from_url(fleet_url()).flushdb()
    yield


def settings() -> Settings:
    return Settings(broker_url=fleet_url(), lease_secs=2.0)


def wait_for_catalog(names: list[str], workers: int = 1, timeout: float = 15.0) -> Catalog:
    """Until each name has ``workers`` live records (workers publish within a heartbeat)."""
    catalog = Catalog(redis.Redis.from_url(fleet_url()))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = catalog.read(names)
        if all(len(entries.get(n, [])) >= workers for n in names):
            return catalog
        time.sleep(0.1)
    raise AssertionError(f"the catalog never showed {names} on {workers} worker(s): {catalog.read()}")


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "CRIOGENAI_BROKER_URL": fleet_url(), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "criogenai", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=60,
    )


# -- the compose file -----------------------------------------------------------------------------


def _docker_compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    return probe.returncode == 0


def test_the_compose_file_describes_a_scalable_fleet() -> None:
    import yaml

    if _docker_compose_available():  # docker's own validation, where the compose plugin exists
        check = subprocess.run(
            ["docker", "compose", "-f", "docker-compose.yml", "config", "--quiet"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stderr
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = doc["services"]
    assert set(services) >= {"redis", "worker", "flower", "agent"}
    assert services["redis"]["image"] == "redis:7"
    worker = services["worker"]
    assert worker["build"] == "."
    # Scaling with --scale worker=N: no fixed container name, no host port to collide on.
    assert "container_name" not in worker and "ports" not in worker
    env = worker["environment"]
    assert env["CRIOGENAI_BROKER_URL"] == "redis://redis:6379/0"
    assert env["CRIOGENAI_TOOLS"] == "examples.clinic"
    assert env["CRIOGENAI_SIGNING_SECRET"].startswith("${CRIOGENAI_SIGNING_SECRET:-")
    assert services["agent"]["environment"]["CRIOGENAI_BROKER_URL"] == env["CRIOGENAI_BROKER_URL"]
    assert services["agent"]["command"][:2] == ["criogenai", "demo"]
    flower = services["flower"]
    assert flower["image"].startswith("mher/flower")
    assert "--broker=redis://redis:6379/0" in flower["command"]
    # Every option the compose file and the Dockerfile give the CLI exists.
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "FROM python:3.12-slim" in dockerfile
    cmd = json.loads(next(line for line in dockerfile.splitlines() if line.startswith("CMD "))[4:])
    for argv in (worker["command"], cmd, services["agent"]["command"]):
        helped = cli(*argv[1:2], "--help")
        assert helped.returncode == 0, helped.stderr
        for option in (a for a in argv if a.startswith("--")):
            assert option in helped.stdout, f"{argv[1]} has no option {option}"


# -- the catalog ----------------------------------------------------------------------------------


AGENT_WITHOUT_TOOL_CODE = textwrap.dedent(
    """
    import json, sys
    from criogenai import Dispatcher, Settings, ToolRegistry
    try:
        import tests.fleet_tools
        sys.exit("the tools' code is importable here; the test proves nothing")
    except ImportError:
        pass
    settings = Settings(broker_url=sys.argv[1], lease_secs=2.0)
    registry = ToolRegistry.from_catalog(["echo", "count"], settings)
    with Dispatcher(registry, settings=settings) as d:
        results = d.run_turn_sync([
            {"id": "a", "name": "echo", "arguments": {"text": "from the catalog"}},
            {"id": "b", "name": "echo", "arguments": {"text": 7}},
            {"id": "c", "name": "count", "arguments": {"key": sys.argv[2]}},
        ])
    print(json.dumps({
        "results": [r.model_dump(mode="json") for r in results],
        "hashes": {t.name: t.schema_hash for t in registry},
        "tool_modules": sorted(m for m in sys.modules if m.startswith(("tests", "examples"))),
    }))
    """
)


def test_an_agent_process_without_the_tools_code_runs_a_turn_from_the_catalog(
    clean: None, worker_factory: Factory, tmp_path: Path
) -> None:
    worker_factory(queues="criogenai")
    catalog = wait_for_catalog(["echo", "count"])
    published = {n: es[0].schema_hash for n, es in catalog.read(["echo", "count"]).items()}
    script = tmp_path / "agent.py"
    script.write_text(AGENT_WITHOUT_TOOL_CODE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    key = f"catalog-{time.time_ns()}"
    run = subprocess.run(
        [sys.executable, str(script), fleet_url(), key],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["tool_modules"] == []
    assert out["hashes"] == published  # the same schemas as the worker's own tools
    a, b, c = out["results"]
    assert (a["status"], a["content"]) == ("ok", "from the catalog")
    # Validated in the agent process against the catalog's schema: never reached a worker.
    assert b["status"] == "invalid_arguments" and b["attempts"] == 0
    assert "7 is not of type 'string'" in b["content"]
    assert c["status"] == "ok" and json.loads(c["content"])["n"] == 1


def test_an_unknown_tool_name_is_refused_when_building_from_the_catalog(
    clean: None, worker_factory: Factory
) -> None:
    worker_factory(queues="criogenai")
    wait_for_catalog(["echo"])
    with pytest.raises(ConfigurationError, match="no live worker serves 'launch_rocket'"):
        ToolRegistry.from_catalog(["echo", "launch_rocket"], settings())


ECHO_V2 = textwrap.dedent(
    '''
    from criogenai import tool

    @tool(read_only=True)
    def echo(text: str, loud: bool = False) -> str:
        """Return the text, louder if asked."""
        return text.upper() if loud else text
    '''
)


def test_two_workers_serving_one_tool_with_different_schemas_are_reported(
    clean: None, worker_factory: Factory, tmp_path: Path
) -> None:
    (tmp_path / "echo_v2.py").write_text(ECHO_V2)
    old = worker_factory(queues="criogenai")
    new = worker_factory(
        queues="criogenai", tools="echo_v2", extra_env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{PYTHONPATH}"}
    )
    catalog = wait_for_catalog(["echo"], workers=2)
    hashes = {e.worker: e.schema_hash for e in catalog.read(["echo"])["echo"]}
    assert len(set(hashes.values())) == 2
    with pytest.raises(ConfigurationError) as raised:
        ToolRegistry.from_catalog(["echo"], settings())
    message = str(raised.value)
    for worker in (old.name, new.name):
        assert worker in message and hashes[worker] in message
    # A tool only one version of which is live still builds.
    assert ToolRegistry.from_catalog(["count"], settings()).names() == ["count"]
    listed = cli("tools")
    assert listed.returncode == 0, listed.stderr
    assert "warning: tool 'echo' is served with different schemas" in listed.stderr
    assert all(h in listed.stderr for h in hashes.values())
    echo_rows = [line for line in listed.stdout.splitlines() if line.startswith("echo ")]
    assert len(echo_rows) == 2 and {old.name, new.name} == {row.split()[-1] for row in echo_rows}


def test_a_stopped_worker_withdraws_its_tools_from_the_catalog(clean: None, worker_factory: Factory) -> None:
    w = worker_factory(queues="criogenai")
    catalog = wait_for_catalog(["echo"])
    w.stop()
    assert "echo" not in catalog.read(["echo"])
    listed = cli("tools", "echo")
    assert "no live worker serves echo" in listed.stderr


def test_a_killed_workers_tools_leave_the_catalog_when_its_heartbeat_stops(
    clean: None, worker_factory: Factory
) -> None:
    # Given a fleet whose processes agree on a 3 s heartbeat TTL (the default is 15 s)
    short = Settings(broker_url=fleet_url(), lease_secs=2.0, heartbeat_ttl_secs=3)
    w = worker_factory(queues="criogenai", extra_env={"CRIOGENAI_HEARTBEAT_TTL_SECS": "3"})
    catalog = wait_for_catalog(["echo"])
    killed_at = time.monotonic()
    w.kill()  # no clean shutdown: its records stay in Redis, but its heartbeat stops
    live = Catalog.from_settings(short)
    while "echo" in live.read(["echo"]) and time.monotonic() < killed_at + 30:
        time.sleep(0.1)
    # Then its tools leave within the TTL (plus a beat), not the default's 15 s
    assert "echo" not in live.read(["echo"])
    assert time.monotonic() - killed_at < 3 + 3
    assert "echo" in catalog.read(["echo"]), "with the default TTL the worker still counts as alive"
    with pytest.raises(ConfigurationError, match="no live worker serves 'echo'"):
        ToolRegistry.from_catalog(["echo"], short)


def test_the_catalog_is_published_again_soon_after_redis_loses_it(
    clean: None, worker_factory: Factory
) -> None:
    worker_factory(queues="criogenai")
    wait_for_catalog(["echo"])
    redis.Redis.from_url(fleet_url()).flushdb()  # as a Redis restart without persistence would
    # Well before the 30 s refresh: each heartbeat checks that its records are still there.
    wait_for_catalog(["echo"], timeout=10.0)


# -- routing --------------------------------------------------------------------------------------


def test_a_tool_of_its_own_queue_runs_only_on_that_queues_workers(
    clean: None, worker_factory: Factory
) -> None:
    gpu = worker_factory(queues="fleet-gpu", extra_env={"CRIOGENAI_TEST_LABEL": "gpu"})
    cpu = worker_factory(queues="criogenai", extra_env={"CRIOGENAI_TEST_LABEL": "cpu"})
    catalog = wait_for_catalog(["where_gpu", "where"])
    entries = catalog.read(["where_gpu", "where"])
    # Each worker publishes only the tools of the queues it serves.
    assert [e.worker for e in entries["where_gpu"]] == [gpu.name]
    assert [e.worker for e in entries["where"]] == [cpu.name]
    assert entries["where_gpu"][0].queue == "fleet-gpu"
    client = redis.Redis.from_url(fleet_url())
    assert client.zscore("crg:workers:criogenai", gpu.name) is None
    calls = [ToolCall(id=f"g{i}", name="where_gpu") for i in range(20)]
    calls += [ToolCall(id=f"c{i}", name="where") for i in range(20)]
    with make_dispatcher() as d:  # type: ignore[attr-defined]
        results = d.run_turn_sync(calls)
    ran = collections.Counter((r.call_id[0], r.status, r.content) for r in results)
    assert ran == {("g", "ok", "gpu"): 20, ("c", "ok", "cpu"): 20}


# -- large results --------------------------------------------------------------------------------


def test_a_cut_results_full_text_is_fetched_by_reference(clean: None, worker_factory: Factory) -> None:
    worker_factory(queues="criogenai")
    limits = Limits(max_result_chars=1_000, max_stored_result_chars=200_000)
    with make_dispatcher(limits=limits) as d:  # type: ignore[attr-defined]
        whole, capped, small = d.run_turn_sync(
            [
                ToolCall(id="whole", name="big", arguments={"n": 150_000}),
                ToolCall(id="capped", name="big", arguments={"n": 300_000}),
                ToolCall(id="small", name="big", arguments={"n": 10}),
            ]
        )
        assert whole.truncated and len(whole.content) <= 1_000
        assert "the result had 150,000 characters" in whole.content
        assert d.fetch_full(whole.run_id, "whole") == "x" * 150_000
        kept = d.fetch_full(capped.run_id, "capped")
        assert len(kept) <= 200_000 and kept.startswith("x" * 150_000) and "300,000" in kept
        assert d.fetch_full(small.run_id, "small") == "x" * 10
        with pytest.raises(LookupError):
            d.fetch_full(whole.run_id, "no-such-call")
    printed = cli("result", whole.run_id, "whole")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == "x" * 150_000 + "\n"
    missing = cli("result", whole.run_id, "no-such-call")
    assert missing.returncode == 1 and "no result is kept" in missing.stderr


# -- logs and metrics -----------------------------------------------------------------------------


def test_json_logs_carry_run_id_call_id_tool_attempt_status_and_duration(
    clean: None, worker_factory: Factory
) -> None:
    w = worker_factory(
        queues="criogenai", pool="prefork", concurrency=2, extra_env={"CRIOGENAI_LOG_FORMAT": "json"}
    )
    key = f"logs-{time.time_ns()}"
    with make_dispatcher() as d:  # type: ignore[attr-defined]
        results = d.run_turn_sync(
            [
                ToolCall(id="ok", name="echo", arguments={"text": "hi"}),
                ToolCall(id="err", name="flaky_write", arguments={"key": key, "fail_times": 5}),
            ]
        )
    run_id = results[0].run_id
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and w.output().count('"call finished"') < 2:
        time.sleep(0.1)
    lines = [line for line in w.output().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    finished = {r["call_id"]: r for r in records if r["message"] == "call finished"}
    assert set(finished) == {"ok", "err"}
    for call_id, status, tool in (("ok", "ok", "echo"), ("err", "tool_error", "flaky_write")):
        r = finished[call_id]
        assert (r["run_id"], r["tool"], r["attempt"], r["status"]) == (run_id, tool, 1, status)
        assert isinstance(r["duration_secs"], float)
    # Celery (and so Flower) knows each task by the tool's name, never by its arguments.
    received = [r["message"] for r in records if r["message"].startswith("Task tool:echo[")]
    assert any(m.endswith("] received") for m in received), received


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_metrics_endpoint_counts_a_turns_calls_across_prefork_children(
    clean: None, worker_factory: Factory
) -> None:
    port = _free_port()
    worker_factory(
        queues="criogenai", pool="prefork", concurrency=3, extra_env={"CRIOGENAI_METRICS_PORT": str(port)}
    )
    key = f"metrics-{time.time_ns()}"
    from criogenai import Retry

    with make_dispatcher(tool_retry=Retry(max_attempts=3, initial_backoff=0.05)) as d:  # type: ignore[attr-defined]
        results = d.run_turn_sync(
            [
                *(ToolCall(id=f"e{i}", name="echo", arguments={"text": str(i)}) for i in range(6)),
                ToolCall(id="w", name="flaky_write", arguments={"key": key + "w", "fail_times": 5}),
                ToolCall(id="r", name="flaky_read", arguments={"key": key + "r", "fail_times": 1}),
            ]
        )
    assert [r.status for r in results] == ["ok"] * 6 + ["tool_error", "ok"]
    want = {
        ("criogenai_calls_total", (("status", "ok"), ("tool", "echo"))): 6.0,
        ("criogenai_calls_total", (("status", "tool_error"), ("tool", "flaky_write"))): 1.0,
        ("criogenai_calls_total", (("status", "ok"), ("tool", "flaky_read"))): 1.0,
        ("criogenai_retries_total", (("tool", "flaky_read"),)): 1.0,
        ("criogenai_call_duration_seconds_count", (("tool", "echo"),)): 6.0,
    }
    deadline = time.monotonic() + 15
    seen: dict[Any, float] = {}
    while time.monotonic() < deadline:
        seen = _scrape(port)
        if all(seen.get(k) == v for k, v in want.items()):
            break
        time.sleep(0.2)
    assert {k: seen.get(k) for k in want} == want
    # The retry was published through kombu with its due time: its wait in the queue is measured.
    assert seen.get(("criogenai_queue_wait_seconds_count", (("tool", "flaky_read"),)), 0) >= 1


# -- scale-out ------------------------------------------------------------------------------------


def test_three_worker_processes_share_a_300_call_load(clean: None, worker_factory: Factory) -> None:
    for label in ("w1", "w2", "w3"):
        worker_factory(queues="criogenai", concurrency=4, extra_env={"CRIOGENAI_TEST_LABEL": label})
    calls = [ToolCall(id=f"c{i}", name="where", arguments={"pause": 0.02}) for i in range(300)]
    with make_dispatcher(limits=Limits(max_calls_per_turn=300)) as d:  # type: ignore[attr-defined]
        started = time.monotonic()
        results = d.run_turn_sync(calls)
        elapsed = time.monotonic() - started
    assert [r.status for r in results] == ["ok"] * 300, collections.Counter(r.status for r in results)
    share = collections.Counter(r.content for r in results)
    print(f"300 calls on 3 workers in {elapsed:.1f} s: {dict(share)}")
    assert set(share) == {"w1", "w2", "w3"} and min(share.values()) >= 10, share


def test_a_dispatcher_needs_no_tool_code_to_route_by_queue(clean: None, worker_factory: Factory) -> None:
    worker_factory(queues="fleet-gpu", extra_env={"CRIOGENAI_TEST_LABEL": "gpu"})
    wait_for_catalog(["where_gpu"])
    registry = ToolRegistry.from_catalog(["where_gpu"], settings())
    [t] = list(registry)
    assert (t.queue, t.read_only) == ("fleet-gpu", True)
    with Dispatcher(registry, settings=settings()) as d:
        [r] = d.run_turn_sync([ToolCall(id="g", name="where_gpu")])
    assert (r.status, r.content) == ("ok", "gpu")
