"""A whole fleet under the least-privilege ACL user of ``criogenai._acl``, on a Redis of the test's own.

Workers, a dispatcher, approvals, cancelling, fleet-wide limits, retries, redelivery after a killed
worker and Celery's remote control all run as that user; at the end Redis's ``ACL LOG`` must be
empty: nothing the fleet did was refused. The tools' own run counters use the admin user.
"""

from __future__ import annotations

import concurrent.futures
import signal
from pathlib import Path

import redis

from criogenai import Approvals, Retry, Settings, ToolCall, ToolRegistry
from criogenai._acl import acl_setuser, fleet_acl_rules
from criogenai.worker import create_app
from tests.conftest import (
    OwnRedis,
    WorkerProcess,
    key,
    make_dispatcher,
    start_worker,
    wait_for,
    wait_until_live,
)
from tests.integration.test_security import spare_port

QUEUES = ("criogenai", "fleet-gpu", "nobody-serves-this")  # every queue of tests.fleet_tools


def test_the_rendered_command_is_the_rules_the_fleet_test_uses() -> None:
    rules = " ".join(fleet_acl_rules(db=3, queues=("gpu",), prefix="p"))
    assert acl_setuser("u", "pw", db=3, queues=("gpu",), prefix="p") == f"ACL SETUSER u on >pw {rules}"
    assert "&/3.celery.pidbox" in rules and "~gpu*" in rules and "~p:*" in rules


def test_a_fleet_runs_under_the_least_privilege_acl_user_with_nothing_refused(tmp_path: Path) -> None:
    server = OwnRedis(tmp_path, spare_port(), password=f"admin-{key()}")
    server.start()
    admin = redis.Redis(port=server.port, password=server.password)
    password = f"fleet-{key()}"
    rules = fleet_acl_rules(queues=QUEUES)
    admin.execute_command("ACL", "SETUSER", "criogenai", "on", f">{password}", *rules)
    admin.execute_command("ACL", "LOG", "RESET")
    url = f"redis://criogenai:{password}@127.0.0.1:{server.port}/0"
    counters = {"CRIOGENAI_TEST_COUNTER_URL": server.url}

    def runs(k: str) -> int:
        return int(admin.get(f"test:runs:{k}") or 0)

    def worker(pool: str, *args: str) -> WorkerProcess:
        w = start_worker(url, tmp_path, pool=pool, concurrency=2, extra_env=counters, extra_args=args,
                         wait=False)
        wait_until_live(server.url, w.name, w)  # looked for as admin: the fleet's user may not SCAN
        return w

    settings = Settings(broker_url=url, lease_secs=2.0)
    a = worker("prefork", "--events")
    b = None
    try:
        with make_dispatcher(settings=settings, tool_retry=Retry(max_attempts=3, initial_backoff=0.1),
                             approve=["count"]) as d, concurrent.futures.ThreadPoolExecutor(1) as ex:
            # A tool that kills its prefork child: the worker sends the call again, a bounded number of times
            [died] = d.run_turn_sync([ToolCall(id="die", name="die", arguments={"key": key()})])
            assert died.status == "lost", died
            # A call whose worker is SIGKILLed runs again on another worker
            k = key()
            # (long enough that the second worker is up before the first finishes, on a loaded machine)
            fut = ex.submit(d.run_turn_sync, [ToolCall(id="slow", name="sleep_for",
                                                       arguments={"seconds": 8, "key": k})])
            wait_for(lambda: runs(k) == 1, what="the call to start on the first worker")
            b = worker("threads")
            a.kill(signal.SIGKILL)
            [again] = fut.result(timeout=30)
            assert (again.status, runs(k)) == ("ok", 2), again
            # Retries, a fleet-wide limit and an approval, then the approved call on the turn's resume
            flaky, gauge, approved = key(), key(), key()
            run_id = f"run-{key()}"
            calls = [
                ToolCall(id="echo", name="echo", arguments={"text": "as criogenai"}),
                ToolCall(id="flaky", name="flaky_read", arguments={"key": flaky, "fail_times": 1}),
                *(ToolCall(id=f"g{i}", name="gauge_capped", arguments={"key": gauge, "seconds": 0.3})
                  for i in range(3)),
                ToolCall(id="needs_ok", name="count", arguments={"key": approved}),
            ]
            first = {r.call_id: r for r in d.run_turn_sync(calls, run_id=run_id)}
            assert first["echo"].content == "as criogenai" and first["flaky"].attempts == 2
            assert [first[f"g{i}"].status for i in range(3)] == ["ok"] * 3
            assert int(admin.get(f"test:peak:{gauge}") or 0) <= 2
            assert first["needs_ok"].status == "pending_approval"
            Approvals(settings).approve(run_id, "needs_ok", by="ops")
            resumed = {r.call_id: r for r in d.run_turn_sync(calls, run_id=run_id)}
            assert resumed["needs_ok"].status == "ok" and runs(approved) == 1
            # Cancelling a running turn
            slow, cancelled_run = key(), f"run-{key()}"
            fut = ex.submit(d.run_turn_sync, [ToolCall(id="s", name="sleep_for",
                                                       arguments={"seconds": 30, "key": slow})],
                            run_id=cancelled_run)
            wait_for(lambda: runs(slow) == 1, what="the call to be cancelled to start")
            d.cancel(cancelled_run)
            [stopped] = fut.result(timeout=30)
            assert stopped.status == "cancelled", stopped
        # An agent process reading the tool catalog, and Celery's remote control through the pidbox
        assert ToolRegistry.from_catalog(["echo"], settings).names() == ["echo"]
        replies = create_app(settings).control.ping(timeout=2.0)
        assert any(b.name in reply for reply in replies), replies
    finally:
        for w in (a, b):
            if w is not None:
                w.stop()
        log = admin.execute_command("ACL", "LOG")
        server.stop()
    assert log == [], log


def test_the_readme_quotes_the_rendered_command() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert acl_setuser("criogenai", "PASSWORD") in readme.splitlines()
