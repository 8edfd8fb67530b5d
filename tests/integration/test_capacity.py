"""Capacity: many waiting calls in flight on one worker process, on a bounded number of Redis
connections, and tools that leave by ``sys.exit`` or a ``BaseException``.

Correctness only (every call ``ok``, all of them in flight at once, the connection bound); how
fast is measured by ``bench/bench_capacity.py``, beside plain Celery.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from bench.procfs import connections_to

from criogenai import Limits, Settings, ToolCall, ToolResult
from criogenai.runner._outcomes import GENERIC_FAILURE
from criogenai.worker import create_app
from tests import fleet_tools
from tests.conftest import OwnRedis, fleet_url, key, make_dispatcher, start_worker

CONNECTION_BOUND = 16
"""The most Redis connections a worker on criogenai's threads pool may open, at any concurrency
(README, Performance: its claims and filings share one connection, kombu and the lease and
heartbeat threads a few more)."""


def redis_connections(pid: int) -> int:
    """The process's established TCP connections to the tests' Redis."""
    return connections_to(pid, urlsplit(fleet_url()).port or 6379)


class PeakConnections:
    """The most connections a process held while the block ran, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakConnections:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, redis_connections(self.pid))


def most_at_once(results: list[ToolResult]) -> int:
    """The most calls that were waiting at the same moment, from the spans the tools returned."""
    edges = []
    for r in results:
        began, ended = json.loads(r.content)
        edges += [(began, 1), (ended, -1)]
    running = peak = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("tool", ["span_async", "span_sync"])
def test_a_worker_at_concurrency_300_holds_300_waiting_calls_at_once_on_a_few_connections(
    worker_factory, tool: str
) -> None:
    worker = worker_factory(pool="threads", concurrency=300)
    limits = Limits(max_calls_per_turn=300, max_calls_in_flight_per_turn=300, queue_wait_secs=60)
    calls = [ToolCall(id=f"c{i}", name=tool, arguments={"seconds": 3.0}) for i in range(300)]
    with make_dispatcher(limits=limits) as d, PeakConnections(worker.proc.pid) as connections:
        results = d.run_turn_sync(calls)
    assert [r.status for r in results] == ["ok"] * 300, [r for r in results if r.status != "ok"][:3]
    assert most_at_once(results) == 300
    assert 0 < connections.peak <= CONNECTION_BOUND


def test_connections_killed_mid_load_lose_no_call_and_leave_none_waiting(
    own_redis: OwnRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 200 calls in flight on one worker, claiming, running and filing, on a Redis of the
    # test's own (killing every client of the shared one would hit the other tests' clients too)
    worker = start_worker(own_redis.url, tmp_path, pool="threads", concurrency=100)
    monkeypatch.setattr(fleet_tools, "_client", redis.Redis.from_url(own_redis.url))  # the tools' counts
    k = key()
    limits = Limits(max_calls_per_turn=200, max_calls_in_flight_per_turn=200, queue_wait_secs=120)
    calls = [ToolCall(id=f"c{i}", name="mark_run", arguments={"key": f"{k}:{i}"}) for i in range(200)]
    admin = redis.Redis.from_url(own_redis.url)
    try:
        with make_dispatcher(limits=limits, settings=Settings(broker_url=own_redis.url, lease_secs=2.0)) as d:
            started = time.monotonic()
            results_box: list[list[ToolResult]] = []
            runner = threading.Thread(target=lambda: results_box.append(d.run_turn_sync(calls)))
            runner.start()
            # When every client connection of the server is killed, again and again, mid-load
            kills = 0
            while runner.is_alive() and kills < 8:
                kills += admin.client_kill_filter(_type="normal", skipme=True)
                time.sleep(0.15)
            runner.join(90)
            elapsed = time.monotonic() - started
    finally:
        worker.stop()
    assert kills > 0 and results_box, "the turn did not end"
    [results] = results_box
    # Then every call ends ok, ran once (no process died), and none waited out queue_wait_secs
    assert [r.status for r in results] == ["ok"] * 200, [r for r in results if r.status != "ok"][:3]
    assert [fleet_tools.distinct_runs(f"{k}:{i}") for i in range(200)] == [1] * 200
    assert elapsed < 60, f"the turn took {elapsed:.0f} s"


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_tool_leaving_by_sys_exit_or_a_base_exception_is_an_exception_run_once(
    worker_factory, pool: str
) -> None:
    # Given a worker with two slots, and tools that sys.exit() or raise a BaseException with a
    # secret in the text, under return_generic
    log_format = ["--log-format", "json"] if pool == "threads" else []
    worker = worker_factory(pool=pool, concurrency=2, extra_args=tuple(log_format))
    secret = f"pw-{uuid.uuid4().hex}"
    k = key()
    calls = [
        ToolCall(id=f"x{i}", name="exits",
                 arguments={"key": f"{k}:{i}", "secret": secret, "how": ("sys.exit", "base")[i % 2]})
        for i in range(4)
    ]
    with make_dispatcher(on_tool_exception="return_generic",
                         settings=Settings(broker_url=fleet_url(), lease_secs=2.0)) as d:
        results = d.run_turn_sync(calls)
        # Then each is an exception outcome like any other: run once, the text only in the artifact
        assert [(r.status, r.content, r.attempts) for r in results] == [("exception", GENERIC_FAILURE, 1)] * 4
        assert [fleet_tools.runs(f"{k}:{i}") for i in range(4)] == [1] * 4
        assert all(secret in r.artifact["exception"]["message"] for r in results)
        assert {r.artifact["exception"]["type"] for r in results} == {"SystemExit", "Shutdown"}
        # and the slots are free: more calls than slots still run
        echoes = [ToolCall(id=f"e{i}", name="echo", arguments={"text": str(i)}) for i in range(4)]
        more = d.run_turn_sync(echoes)
        assert [r.status for r in more] == ["ok"] * 4
    assert worker.proc.poll() is None
    assert secret not in worker.output()


def test_an_async_tool_that_blocks_the_event_loop_ends_its_worker(worker_factory) -> None:
    # Given a worker whose event loop may be blocked for 2 s at most
    worker = worker_factory(pool="threads", concurrency=4, extra_env={"CRIOGENAI_LOOP_STALL_SECS": "2"})
    with make_dispatcher() as d:
        runner = threading.Thread(target=d.run_turn_sync, daemon=True,
                                  args=([ToolCall(id="b", name="block_loop", arguments={"seconds": 30})],))
        runner.start()
        # When an async tool blocks the loop (time.sleep in an async def), holding every call
        # Then the worker exits with status 3 and says why, well before the tool would return
        assert worker.proc.wait(20) == 3
    assert worker.output().count("the event loop was blocked for more than 2 s") == 1


def test_a_sync_tools_own_log_records_carry_its_calls_ids(worker_factory) -> None:
    worker = worker_factory(pool="threads", concurrency=20, extra_args=("--log-format", "json"))
    calls = [ToolCall(id=f"c{i}", name="log_line", arguments={"text": f"line-{i}"}) for i in range(20)]
    with make_dispatcher() as d:
        results = d.run_turn_sync(calls)
    assert [r.status for r in results] == ["ok"] * 20
    run_id = results[0].run_id
    records = [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]
    mine = {r["message"]: r for r in records if r.get("logger") == "tests.fleet_tools"}
    assert set(mine) == {f"line-{i}" for i in range(20)}
    for i in range(20):
        assert (mine[f"line-{i}"]["run_id"], mine[f"line-{i}"]["call_id"]) == (run_id, f"c{i}")


def test_claims_sent_together_after_redis_lost_its_scripts_all_succeed(own_redis) -> None:  # type: ignore[no-untyped-def]
    # Given calls waiting on the event loop, whose claims go out to Redis in batches
    from criogenai._loop import GreenletRunner
    from criogenai.store import RedisLedger

    ledger = RedisLedger(own_redis.url)
    ledger.claim("run", "warm", "token", time.time() + 60)  # the scripts are loaded
    # When Redis loses its scripts (a restart, SCRIPT FLUSH) just before a batch of 50 claims
    admin = redis.Redis(port=own_redis.port)
    admin.script_flush()
    admin.config_resetstat()
    runner = GreenletRunner(100)
    futures = [runner.submit(ledger.claim, "run", f"c{i}", "token", time.time() + 60) for i in range(50)]
    # Then every claim of the batch is made, once (each answered NOSCRIPT and sent again), and the
    # script is loaded again once, not once per call, each a round trip on the loop's thread
    claims = [f.result(20) for f in futures]
    assert [(c.kind, c.attempt) for c in claims] == [("claimed", 1)] * 50
    loads = admin.info("commandstats").get("cmdstat_script|load", {}).get("calls", 0)
    assert loads == 1, f"the claim script was loaded {loads} times"


def _threads(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def test_a_worker_whose_sync_tools_stay_blocked_in_c_past_their_limit_exits_for_a_restart(
    worker_factory,
) -> None:
    # Given a threads worker with 3 slots that may hold 2 abandoned tool threads
    cap, slots = 2, 3
    worker = worker_factory(pool="threads", concurrency=slots,
                            extra_env={"CRIOGENAI_MAX_ABANDONED_THREADS": str(cap)})
    with make_dispatcher() as d:  # one call first: the threads a worker starts on its first call
        assert d.run_turn_sync([ToolCall(id="warm", name="echo", arguments={"text": "-"})])[0].status == "ok"
    idle_threads = _threads(worker.proc.pid)
    # When a turn sends it more calls of a tool that stays blocked in C past its 1 s limit than
    # it may abandon, beside a 2 s call, then quick calls behind them
    k = key()
    hostile = [ToolCall(id=f"h{i}", name="hang_in_c", arguments={"key": f"{k}:{i}"}) for i in range(5)]
    calls = [*hostile[:2], ToolCall(id="slow", name="sleep_for", arguments={"seconds": 2.0}), *hostile[2:],
             *[ToolCall(id=f"e{i}", name="echo", arguments={"text": str(i)}) for i in range(4)]]
    box: list[list[ToolResult]] = []
    # no_worker_secs: the calls left on the queue wait for the restarted worker
    with make_dispatcher(limits=Limits(no_worker_secs=60)) as d:
        runner = threading.Thread(target=lambda: box.append(d.run_turn_sync(calls)), daemon=True)
        runner.start()
        peak_threads, deadline = 0, time.monotonic() + 30
        while worker.proc.poll() is None and time.monotonic() < deadline:
            peak_threads = max(peak_threads, _threads(worker.proc.pid))
            time.sleep(0.02)
        # Then it stops taking calls once it holds 2, lets those in flight finish, and exits with
        # its own status and one line saying why, its abandoned threads bounded by the cap and the
        # calls in flight (they never return here, so the count it leaves with is its peak)
        assert worker.proc.poll() == 4, "the worker did not exit with status 4 within 30 s"
        output = worker.output()
        assert output.count("2 sync tool threads abandoned past their time limit are still running "
                            "(max_abandoned_threads 2") == 1
        [left] = re.findall(r"stopped with (\d+) sync tool threads abandoned", output)
        assert cap <= int(left) <= cap + slots
        assert peak_threads <= idle_threads + int(left) + slots
        # And once its supervisor starts it again, every call ends with its own status, each
        # hostile call run once (timeout: it may not be retried), none lost; the call in flight
        # when it stopped finished there
        worker_factory(pool="threads", concurrency=slots)
        runner.join(90)
    [results] = box
    assert [(r.call_id, r.status) for r in results] == [(c.id, "ok" if c.name != "hang_in_c" else "timeout")
                                                        for c in calls]
    assert [fleet_tools.runs(f"{k}:{i}") for i in range(5)] == [1] * 5
    assert json.loads(results[2].content)["pid"] == worker.proc.pid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_workers_abandoned_tool_threads_show_in_its_health_metrics_and_stats(worker_factory) -> None:
    # Given a threads worker serving health checks and metrics
    health, metrics = _free_port(), _free_port()
    worker = worker_factory(pool="threads", concurrency=2,
                            extra_args=("--health-port", str(health), "--metrics-port", str(metrics)))
    # When a sync tool stays blocked in C past its limit
    with make_dispatcher() as d:
        [result] = d.run_turn_sync([ToolCall(id="h", name="hang_in_c", arguments={"key": key()})])
    assert result.status == "timeout"
    # Then its abandoned thread is counted in /livez, /readyz, the metrics and Celery's stats,
    # while the worker, under its cap, keeps serving
    with urllib.request.urlopen(f"http://127.0.0.1:{health}/livez", timeout=5) as reply:
        assert json.loads(reply.read()) == {"alive": True, "abandoned_threads": 1}
    with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=5) as reply:
        assert json.loads(reply.read())["abandoned_threads"] == 1
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
    assert "criogenai_abandoned_tool_threads 1.0" in text.splitlines()
    stats = create_app(Settings(broker_url=fleet_url())).control.inspect([worker.name], timeout=5).stats()
    assert stats[worker.name]["pool"]["abandoned-threads"] == 1
def test_calls_waiting_behind_a_busy_fleet_outlive_repeated_connection_kills(
    own_redis: OwnRedis, tmp_path: Path
) -> None:
    # Given a busy fleet: 64 calls of half a second on a worker with 4 slots, most of them queued
    worker = start_worker(own_redis.url, tmp_path, pool="threads", concurrency=4)
    limits = Limits(max_calls_per_turn=64, max_calls_in_flight_per_turn=64, queue_wait_secs=120)
    calls = [ToolCall(id=f"c{i}", name="async_sleep", arguments={"seconds": 0.5}) for i in range(64)]
    admin = redis.Redis.from_url(own_redis.url)
    try:
        with make_dispatcher(limits=limits, settings=Settings(broker_url=own_redis.url, lease_secs=2.0)) as d:
            results_box: list[list[ToolResult]] = []
            runner = threading.Thread(target=lambda: results_box.append(d.run_turn_sync(calls)))
            runner.start()
            # When every client connection is killed again and again while they wait, each kill
            # seen by the dispatcher's monitor (it looks every half second)
            kills = 0
            for _ in range(14):
                if not runner.is_alive():
                    break
                kills += admin.client_kill_filter(_type="normal", skipme=True)
                runner.join(0.5)
            runner.join(60)
    finally:
        worker.stop()
    assert results_box, "the turn did not end"
    [results] = results_box
    # Then none is reported lost ("the workers running it kept dying"): no worker died, and a
    # call that never started is not a run that died; each waits its turn and runs
    assert kills > 0
    assert [r.status for r in results] == ["ok"] * 64, [(r.call_id, r.status, r.content) for r in results
                                                         if r.status != "ok"][:3]


def test_a_soft_limit_arriving_after_its_call_ended_does_not_kill_the_prefork_child(worker_factory) -> None:
    # Given a prefork child that has run a call and waits for the next one
    worker = worker_factory(pool="prefork", concurrency=1)
    k = key()
    with make_dispatcher() as d:
        [first] = d.run_turn_sync([ToolCall(id="a", name="count", arguments={"key": k})])
        child = json.loads(first.content)["pid"]
        # When Celery's soft limit reaches it late, as billiard's timer sends it when the call
        # ended at its own time limit at the same moment (an async tool's): SIGUSR1, between calls
        # (ten times, so that one lands in its wait for the next job and one in sending a result)
        for _ in range(10):
            os.kill(child, signal.SIGUSR1)
            time.sleep(0.1)
        [second] = d.run_turn_sync([ToolCall(id="b", name="count", arguments={"key": k})])
    # Then the child lives on and runs the next call; nothing in the log says it died
    assert (first.status, second.status) == ("ok", "ok")
    assert json.loads(second.content)["pid"] == child
    assert "exited with" not in worker.output() and "SoftTimeLimitExceeded" not in worker.output()


def test_calls_claimed_while_the_loop_is_held_up_keep_their_claims_and_run_once(worker_factory) -> None:
    # Given a worker whose event loop is held up for longer than a lease right after a batch of
    # claims (a loaded worker: thousands of calls on two cores), leases of one second
    worker = worker_factory(pool="threads", concurrency=30, lease_secs=1.0)
    k = key()
    calls = [ToolCall(id="block", name="block_loop", arguments={"seconds": 2.5})]
    calls += [ToolCall(id=f"c{i}", name="sleep_for", arguments={"seconds": 0.1, "key": f"{k}:{i}"})
              for i in range(20)]
    with make_dispatcher(settings=Settings(broker_url=fleet_url(), lease_secs=1.0)) as d:
        results = d.run_turn_sync(calls)
    # Then each claim is renewed from the moment it is made, not from when its call resumes: no
    # lease runs out under a live worker, and no call that must run once runs twice
    assert [r.status for r in results] == ["ok"] * 21
    assert [fleet_tools.runs(f"{k}:{i}") for i in range(20)] == [1] * 20
    assert "lost its claim" not in worker.output()


def test_a_sync_tool_past_its_limit_is_a_timeout_even_when_the_loop_notices_late(worker_factory) -> None:
    # Given a sync tool that runs 1.5 s under a 1 s limit, and an event loop held up for 2.5 s
    # meanwhile (a loaded worker), so that the call's waiter wakes after the tool has returned
    worker = worker_factory(pool="threads", concurrency=4)
    calls = [ToolCall(id="slow", name="sleep_for", arguments={"seconds": 1.5}),
             ToolCall(id="block", name="block_loop", arguments={"seconds": 2.5})]
    with make_dispatcher(limits={"tool_timeout_secs": 1}) as d:
        slow, _ = d.run_turn_sync(calls)
    # Then the call is a timeout, as any tool that runs past its limit (the Tools page), not "ok"
    assert slow.status == "timeout", (slow.status, slow.content)
    assert worker.proc.poll() is None
