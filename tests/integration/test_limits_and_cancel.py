"""Limits that hold across the whole fleet, and cancelling a turn, on real workers.

Tools count their real runs in Redis and record the peak of their concurrent runs
(``fleet_tools.gauge``), so "the limit held" means the measured peak equals the limit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from criogenai import Limits, ToolCall
from tests import fleet_tools
from tests.conftest import PYTHONPATH, ROOT, fleet_url, key, make_dispatcher, wait_for


@pytest.fixture(autouse=True)
def _clean_fleet_db(redis_up: None) -> None:
    redis.Redis.from_url(fleet_url()).flushdb()




def gauges(k: str, n: int, seconds: float, name: str = "gauge") -> list[ToolCall]:
    return [ToolCall(id=f"c{i}", name=name, arguments={"key": k, "seconds": seconds, "tag": str(i)})
            for i in range(n)]


# -- fleet-wide limits ------------------------------------------------------------------------------


def test_a_per_tool_limit_holds_across_two_worker_processes(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=4)
    worker_factory(pool="threads", concurrency=4)
    k = key()
    with make_dispatcher(limits=Limits(tool_concurrency={"gauge": 3})) as d:
        results = d.run_turn_sync(gauges(k, 12, 0.4))
    assert [r.status for r in results] == ["ok"] * 12, results
    assert [r.call_id for r in results] == [f"c{i}" for i in range(12)]
    assert fleet_tools.runs(k) == 12
    assert fleet_tools.peak(k) == 3  # 8 worker slots, but never more than 3 at once
    pids = {json.loads(r.content) for r in results}
    assert len(pids) == 2, "both workers should have run calls"
    # calls over the limit wait in order: the first three in are the first three calls
    assert sorted(fleet_tools.started_order(k)[:3]) == ["0", "1", "2"]


def test_a_tools_own_max_concurrency_holds_across_two_dispatchers(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=6)
    k = key()
    with make_dispatcher() as d1, make_dispatcher() as d2, concurrent.futures.ThreadPoolExecutor(2) as ex:
        f1 = ex.submit(d1.run_turn_sync, gauges(k, 4, 0.4, "gauge_capped"))
        f2 = ex.submit(d2.run_turn_sync, gauges(k, 4, 0.4, "gauge_capped"))
        results = f1.result(60) + f2.result(60)
    assert [r.status for r in results] == ["ok"] * 8, results
    assert fleet_tools.runs(k) == 8
    assert fleet_tools.peak(k) == 2  # @tool(max_concurrency=2), shared by both dispatchers


def test_a_turn_never_has_more_calls_in_flight_than_its_cap(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=10)
    k = key()
    with make_dispatcher(limits=Limits(max_calls_in_flight_per_turn=4)) as d:
        results = d.run_turn_sync(gauges(k, 16, 0.3))
    assert [r.status for r in results] == ["ok"] * 16, results
    assert [r.call_id for r in results] == [f"c{i}" for i in range(16)]
    assert fleet_tools.runs(k) == 16
    assert 2 <= fleet_tools.peak(k) <= 4  # 10 worker slots free, but at most 4 of the turn at once
    # the next call is published as results come in, in call order
    assert sorted(fleet_tools.started_order(k)[:4]) == ["0", "1", "2", "3"]


def test_a_tenant_limit_holds_for_that_tenant_only(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=10)
    acme, other = key(), key()
    limits = Limits(tenant_concurrency={"acme": 2, "*": 8})
    with (
        make_dispatcher(limits=limits) as d1,
        make_dispatcher(limits=limits) as d2,
        concurrent.futures.ThreadPoolExecutor(3) as ex,
    ):
        a1 = ex.submit(d1.run_turn_sync, gauges(acme, 4, 0.4), tenant="acme")
        a2 = ex.submit(d2.run_turn_sync, gauges(acme, 4, 0.4), tenant="acme")
        o = ex.submit(d1.run_turn_sync, gauges(other, 4, 0.4), tenant="globex")
        results = a1.result(60) + a2.result(60) + o.result(60)
    assert [r.status for r in results] == ["ok"] * 12, results
    assert fleet_tools.runs(acme) == 8 and fleet_tools.runs(other) == 4
    assert fleet_tools.peak(acme) == 2  # across two dispatchers
    assert fleet_tools.peak(other) >= 3  # another tenant is not held back by acme's limit


def test_a_call_that_cannot_get_a_place_in_time_ends_not_started(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=4)
    k = key()
    limits = Limits(tool_concurrency={"gauge": 1}, queue_wait_secs=1.5)
    with make_dispatcher(limits=limits) as d:
        started = time.monotonic()
        results = d.run_turn_sync(gauges(k, 3, 2.5))
        elapsed = time.monotonic() - started
    assert [r.status for r in results] == ["ok", "not_started", "not_started"], results
    assert "concurrency or rate limit" in results[1].content
    assert fleet_tools.runs(k) == 1
    assert elapsed < 10


def test_a_dead_dispatchers_places_come_back(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=4)
    k = key()
    script = (
        "from criogenai import Limits, ToolCall\n"
        "from tests.conftest import make_dispatcher\n"
        "d = make_dispatcher(limits=Limits(tool_concurrency={'gauge': 2}))\n"
        f"d.run_turn_sync([ToolCall(id=f'h{{i}}', name='gauge', arguments={{'key': {k!r}, 'seconds': 30}})"
        " for i in range(2)])\n"
    )
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    agent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env)
    try:
        wait_for(lambda: fleet_tools.runs(k) == 2, what="the holder's calls to start")
    finally:
        agent.kill()
        agent.wait(10)
    # Its two places are held until their lease runs out (3 s here); then another turn gets in.
    k2 = key()
    with make_dispatcher(limits=Limits(tool_concurrency={"gauge": 2})) as d:
        started = time.monotonic()
        [r] = d.run_turn_sync(gauges(k2, 1, 0.1))
    assert r.status == "ok"
    assert time.monotonic() - started < 15


def test_a_per_tool_rate_limit_holds_across_two_dispatchers(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=8)
    k = key()
    limits = Limits(tool_rate={"gauge": "4/s"})
    calls = gauges(k, 12, 0.05)
    with (
        make_dispatcher(limits=limits) as d1,
        make_dispatcher(limits=limits) as d2,
        concurrent.futures.ThreadPoolExecutor(2) as ex,
    ):
        started = time.monotonic()
        halves = [ex.submit(d.run_turn_sync, part) for d, part in ((d1, calls[:6]), (d2, calls[6:]))]
        results = [r for h in halves for r in h.result(timeout=60)]
        elapsed = time.monotonic() - started
    assert [r.status for r in results] == ["ok"] * 12, results
    at = fleet_tools.start_times(k)
    assert len(at) == 12
    # 4 starts per second at most: any 5 consecutive starts span about a second or more (start
    # latency after admission moves a start by a few tens of milliseconds)
    assert min(at[i + 4] - at[i] for i in range(len(at) - 4)) > 0.75, at
    assert elapsed >= 1.9, elapsed


# -- cancelling -------------------------------------------------------------------------------------


def _running_and_queued(slow: list[str], queued: list[str]) -> list[ToolCall]:
    calls = [ToolCall(id=f"run{i}", name="sleep_for", arguments={"seconds": 30, "key": k})
             for i, k in enumerate(slow)]
    calls += [ToolCall(id=f"q{i}", name="count", arguments={"key": k}) for i, k in enumerate(queued)]
    return calls


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_cancelling_a_turn_stops_running_calls_and_queued_ones_never_run(worker_factory, pool: str) -> None:
    worker = worker_factory(pool=pool, concurrency=2)
    slow, queued = [key(), key()], [key() for _ in range(4)]
    run_id = f"run-{key()}"
    with make_dispatcher() as d, concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(d.run_turn_sync, _running_and_queued(slow, queued), run_id=run_id)
        wait_for(lambda: all(fleet_tools.runs(k) == 1 for k in slow), what="the slow calls to start")
        cancelled_at = time.monotonic()
        d.cancel(run_id)
        results = fut.result(timeout=30)
        elapsed = time.monotonic() - cancelled_at
    assert [r.status for r in results] == ["cancelled"] * 6, results
    assert elapsed < 8, f"the turn took {elapsed:.1f} s to return after cancel (a sleep of 30 s)"
    assert [r.attempts for r in results[:2]] == [1, 1]
    assert all("stopped" in r.content for r in results[:2]), results[:2]
    assert all(r.attempts == 0 for r in results[2:])
    time.sleep(1.5)  # the queued messages reach the freed worker slots, which must not run them
    assert [fleet_tools.runs(k) for k in queued] == [0, 0, 0, 0]
    assert [fleet_tools.runs(k) for k in slow] == [1, 1]
    # a stopped tool that is still sleeping does not hold the worker's shutdown
    worker.kill(signal.SIGTERM)
    worker.proc.wait(timeout=8)


def test_the_cli_cancels_a_run_another_process_is_running(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=1)
    slow, queued = [key()], [key(), key()]
    run_id = f"run-{key()}"
    with make_dispatcher() as d, concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(d.run_turn_sync, _running_and_queued(slow, queued), run_id=run_id)
        wait_for(lambda: fleet_tools.runs(slow[0]) == 1, what="the slow call to start")
        env = {**os.environ, "CRIOGENAI_BROKER_URL": fleet_url(), "PYTHONPATH": PYTHONPATH}
        out = subprocess.run([sys.executable, "-m", "criogenai", "cancel", run_id], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert run_id in out.stdout
        results = fut.result(timeout=30)
    assert [r.status for r in results] == ["cancelled"] * 3, results
    assert [fleet_tools.runs(k) for k in queued] == [0, 0]


def test_cancelling_the_task_awaiting_a_turn_cancels_its_calls(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=1)
    k, queued = key(), key()
    calls = [ToolCall(id="a", name="async_sleep", arguments={"seconds": 30, "key": k}),
             ToolCall(id="q", name="count", arguments={"key": queued})]

    async def main() -> None:
        with make_dispatcher() as d:
            task = asyncio.ensure_future(d.run_turn(calls))
            await asyncio.sleep(1.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # the worker stops the coroutine (at its next lease renewal, every 2/3 s here)
            deadline = time.monotonic() + 10
            while fleet_tools.runs(k + ":cancelled") == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)

    asyncio.run(main())
    assert fleet_tools.runs(k + ":cancelled") == 1
    time.sleep(1.0)
    assert fleet_tools.runs(queued) == 0


def test_a_turn_waiting_at_a_limit_is_cancelled_without_running(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=4)
    k = key()
    run_id = f"run-{key()}"
    with (
        make_dispatcher(limits=Limits(tool_concurrency={"gauge": 1})) as d,
        concurrent.futures.ThreadPoolExecutor(1) as ex,
    ):
        fut = ex.submit(d.run_turn_sync, gauges(k, 4, 30), run_id=run_id)
        wait_for(lambda: fleet_tools.runs(k) == 1, what="the first call to start")
        d.cancel(run_id)
        results = fut.result(timeout=30)
        # the place the stopped call held is free again
        [after] = d.run_turn_sync([ToolCall(id="after", name="gauge",
                                            arguments={"key": key(), "seconds": 0.1})])
    assert [r.status for r in results] == ["cancelled"] * 4, results
    assert fleet_tools.runs(k) == 1
    assert after.status == "ok"
