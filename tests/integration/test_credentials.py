"""Refused credentials, whenever Redis refuses them: workers exit, dispatchers say it once.

Every Redis here is the test's own (a password, TLS client certificates), never the shared one.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from criogenai import Settings, ToolCall
from tests.conftest import OwnRedis, WorkerProcess, key, start_worker, wait_for
from tests.integration.test_security import TOOLS, TlsRedis, make_dispatcher, spare_port

REFUSED = "Redis refused the credentials in the URL"


def refusal_lines(worker: WorkerProcess, what: str = REFUSED) -> list[str]:
    return [line for line in worker.output().splitlines() if what in line]


def exits_with_one_line(worker: WorkerProcess, what: str, secrets: list[str], within: float = 30) -> None:
    """The worker exits non-zero by itself, having said why once, without any secret."""
    try:
        code = worker.proc.wait(within)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker still runs:\n{worker.output()[-3000:]}") from None
    out = worker.output()
    assert code == 2, out[-3000:]
    assert len(refusal_lines(worker, what)) == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    for secret in secrets:
        assert secret not in out


@pytest.fixture
def locked(tmp_path: Path) -> OwnRedis:
    """A password-protected redis-server of the test's own, not started: the test starts it."""
    return OwnRedis(tmp_path, spare_port(), password=f"pw-{key()}")


def test_a_worker_started_before_redis_with_a_wrong_password_exits_once_redis_refuses_it(
    locked: OwnRedis, tmp_path: Path
) -> None:
    # Given a worker started with a wrong password while its Redis is down, retrying the outage
    wrong = locked.url.replace(f":{locked.password}@", ":not-the-password@")
    worker = start_worker(wrong, tmp_path, wait=False)
    try:
        wait_for(lambda: "Cannot connect" in worker.output() or worker.proc.poll() is not None,
                 what="the worker to retry the connection")
        assert worker.proc.poll() is None, worker.output()
        # When Redis comes up and refuses the password
        locked.start()
        # Then the worker exits with status 2 and one line saying why, without the password
        exits_with_one_line(worker, REFUSED, ["not-the-password", str(locked.password)])
    finally:
        worker.stop()
        locked.stop()


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_worker_whose_password_is_rotated_while_it_runs_exits_promptly(
    locked: OwnRedis, tmp_path: Path, pool: str
) -> None:
    # Given a worker serving calls on a Redis with a password
    locked.start()
    old = str(locked.password)
    worker = start_worker(locked.url, tmp_path, pool=pool, concurrency=2, tools=TOOLS)
    try:
        with make_dispatcher(settings=Settings(broker_url=locked.url, lease_secs=2.0)) as d:
            [r] = d.run_turn_sync([ToolCall(id="a", name="echo", arguments={"text": "before"})])
        assert r.status == "ok", r
        # When the password is rotated and every client is disconnected
        admin = redis.Redis(port=locked.port, password=old)
        admin.config_set("requirepass", "rotated-password")
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal")
        # Then the worker exits within seconds, with status 2 and one line, without either password
        exits_with_one_line(worker, REFUSED, [old, "rotated-password"], within=20)
    finally:
        worker.stop()
        locked.stop()


def test_a_dispatcher_with_a_wrong_password_says_so_once_and_ends_its_calls(
    locked: OwnRedis, caplog: pytest.LogCaptureFixture
) -> None:
    locked.start()
    wrong = locked.url.replace(f":{locked.password}@", ":not-the-password@")
    calls = [ToolCall(id=f"c{i}", name="echo", arguments={"text": "x"}) for i in range(3)]
    try:
        started = time.monotonic()
        with (caplog.at_level(logging.INFO, logger="criogenai"),
              make_dispatcher(settings=Settings(broker_url=wrong)) as d):
            results = [r for _ in range(3) for r in d.run_turn_sync(calls)]
    finally:
        locked.stop()
    # Its calls end with a clear status, at once (a refusal is not retried)
    assert {r.status for r in results} == {"not_started"}
    assert all("AuthenticationError" in r.content for r in results)
    assert time.monotonic() - started < 10
    # and the gatherer said so once, no traceback, then how many attempts failed
    gather = [r for r in caplog.records if r.getMessage().startswith("cannot read results")]
    assert len(gather) == 2, [r.getMessage() for r in gather]
    assert REFUSED in gather[0].getMessage() and gather[0].exc_info is None
    assert "gave up after" in gather[1].getMessage()
    assert "not-the-password" not in caplog.text
    # Each turn's failed publish is logged, once per turn, not once per attempt
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) <= 2 * 3, [r.getMessage() for r in tracebacks]


@pytest.fixture
def tls_clients_checked(tmp_path: Path) -> Iterator[TlsRedis]:
    server = TlsRedis(tmp_path, auth_clients=True)
    server.start()
    yield server
    server.stop()


def test_a_worker_without_the_client_certificate_a_tls_redis_asks_for_exits_with_one_line(
    tls_clients_checked: TlsRedis, tmp_path: Path
) -> None:
    # A worker with the client certificate serves: the refusal below is the certificate's
    with_cert = start_worker(tls_clients_checked.url(client_cert=True), tmp_path, tools=TOOLS)
    with_cert.stop()
    worker = start_worker(tls_clients_checked.url(), tmp_path, tools=TOOLS, wait=False)
    try:
        exits_with_one_line(worker, "did not accept this client's TLS certificate", [])
    finally:
        worker.stop()

