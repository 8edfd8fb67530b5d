"""Fixtures shared by the suite: the real Redis, worker subprocesses, dispatchers.

Integration tests talk to the Redis at CRIOGENAI_TEST_REDIS (default 127.0.0.1:6379) and start
real ``criogenai worker`` processes; a missing server fails the test, it never skips it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
PYTHONPATH = os.pathsep.join((str(ROOT / "src"), str(ROOT)))
"""What subprocesses the tests start import from: this checkout's code, whatever is installed."""
REDIS_BASE = os.environ.get("CRIOGENAI_TEST_REDIS", "redis://127.0.0.1:6379")
# One database per concurrent test run, and per pytest-xdist worker of a run (gw0, gw1, ...).
FLEET_DB = int(os.environ.get("CRIOGENAI_TEST_DB", "12")) + int(
    os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0
)
os.environ["CRIOGENAI_TEST_COUNTER_URL"] = f"{REDIS_BASE}/{FLEET_DB}"  # per xdist worker, never inherited


def fleet_url(db: int = FLEET_DB) -> str:
    return f"{REDIS_BASE}/{db}"


@pytest.fixture(scope="session")
def redis_up() -> None:
    try:
        redis.Redis.from_url(fleet_url(), socket_connect_timeout=2).ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"integration tests need Redis at {REDIS_BASE}: {exc}")


class WorkerProcess:
    """A real ``criogenai worker`` subprocess in its own session, so it can be killed whole."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.name, self.proc, self.log = name, proc, log

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the worker's whole process group (main process and pool children)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.kill(signal.SIGKILL)
        self.proc.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_worker(
    url: str,
    tmp: Path,
    *,
    pool: str = "threads",
    concurrency: int = 4,
    queues: str = "",
    tools: str = "tests.fleet_tools",
    lease_secs: float = 2.0,
    extra_env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
    wait: bool = True,
) -> WorkerProcess:
    name = f"w{uuid.uuid4().hex[:6]}@test"
    log = tmp / f"{name}.log"
    env = {
        **os.environ,
        "CRIOGENAI_BROKER_URL": url,
        "CRIOGENAI_TEST_COUNTER_URL": url,
        "CRIOGENAI_LEASE_SECS": str(lease_secs),
        "PYTHONPATH": PYTHONPATH,
        **(extra_env or {}),
    }
    argv = [sys.executable, "-m", "criogenai", "worker", "--tools", tools, "--pool", pool,
            "-c", str(concurrency), "-n", name, "-l", "INFO"]
    if queues:
        argv += ["--queues", queues]
    argv += extra_args
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    worker = WorkerProcess(name, proc, log)
    if wait:
        wait_until_live(url, name, worker)
    return worker


def wait_until_live(url: str, name: str, worker: WorkerProcess, timeout: float = 30) -> None:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for key in client.scan_iter("crg:workers:*"):
            if client.zscore(key, name) is not None:
                return
        if worker.proc.poll() is not None:
            break
        time.sleep(0.05)
    worker.stop()
    raise AssertionError(f"worker {name} did not start:\n{worker.output()[-3000:]}")


@pytest.fixture
def worker_factory(tmp_path: Path, redis_up: None) -> Iterator[object]:
    started: list[WorkerProcess] = []

    def factory(url: str = fleet_url(), **kw: object) -> WorkerProcess:
        w = start_worker(url, tmp_path, **kw)  # type: ignore[arg-type]
        started.append(w)
        return w

    yield factory
    for w in started:
        w.stop()


@pytest.fixture(scope="module", params=["prefork", "threads"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          redis_up: None) -> Iterator[WorkerProcess]:
    """One worker with 10 slots on each pool, shared by a module's tests (which run once per pool)."""
    redis.Redis.from_url(fleet_url()).flushdb()
    w = start_worker(fleet_url(), tmp_path_factory.mktemp("fleet"), pool=request.param,
                     concurrency=10, queues="criogenai")
    yield w
    w.stop()


def make_dispatcher(**kw: object) -> object:
    from criogenai import Dispatcher, Settings
    from criogenai.tools import Tool
    from tests import fleet_tools

    tools = [v for v in vars(fleet_tools).values() if isinstance(v, Tool)]
    settings = kw.pop("settings", None) or Settings(broker_url=fleet_url(), lease_secs=2.0)
    return Dispatcher(tools, settings=settings, **kw)  # type: ignore[arg-type]


class OwnRedis:
    """A redis-server of the test's own, without persistence, that the test may stop and restart."""

    def __init__(self, tmp: Path, port: int, password: str | None = None) -> None:
        self.port, self.tmp, self.password = port, tmp, password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp), *auth],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, password=self.password)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = OwnRedis(tmp_path, port)
    server.start()
    yield server
    server.stop()


def key() -> str:
    """A fresh name for a test's counters and runs, so that tests never see each other's."""
    return uuid.uuid4().hex


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll until the predicate holds; fail the test, naming what it waited for, after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
