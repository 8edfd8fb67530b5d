"""Old copies of a call's message never outrun what its dispatcher reported, on real workers.

A Redis restart before the dispatcher's first check, a signed message replayed after its call
failed the turn, copies still queued when a call was reported ``lost``, a stopped worker that
resumes after another ran its call; and what a finished call leaves in Redis.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time

import pytest
import redis

from criogenai import Dispatcher, Limits, Settings, ToolCall, ToolFailed
from criogenai._keys import Keys
from criogenai._message import send_call
from criogenai._signing import sign
from criogenai._wire import ToolTask
from criogenai.dispatcher import _engine
from criogenai.tools import ToolRegistry
from criogenai.worker import create_app
from tests import fleet_tools
from tests.conftest import fleet_url, key, make_dispatcher, wait_for

pytestmark = pytest.mark.fault

SECRET = "a-test-signing-secret-0123456789"


@pytest.fixture(autouse=True)
def _clean_fleet_db(redis_up: None) -> None:
    redis.Redis.from_url(fleet_url()).flushdb()


def test_a_redis_restart_before_the_dispatchers_first_check_is_noticed(  # type: ignore[no-untyped-def]
    worker_factory, own_redis, monkeypatch
) -> None:
    # Given a fresh dispatcher whose monitor first looks 2 s after it starts (instead of 0.5 s,
    # so that the restart below surely comes first), and calls queued with no worker yet
    monkeypatch.setattr(_engine, "CHECK_AFTER_SECS", 4.0)
    client = redis.Redis.from_url(own_redis.url)
    settings = Settings(broker_url=own_redis.url, lease_secs=2.0)
    registry = ToolRegistry.from_modules(["tests.fleet_tools"])
    calls = [ToolCall(id=f"c{i}", name="echo", arguments={"text": str(i)}) for i in range(8)]
    with (Dispatcher(registry, settings=settings, limits=Limits(queue_wait_secs=40, no_worker_secs=40)) as d,
          concurrent.futures.ThreadPoolExecutor(1) as ex):
        fut = ex.submit(d.run_turn_sync, calls)
        wait_for(lambda: client.llen("criogenai") == 8, what="the 8 calls to be queued")
        # When Redis restarts, wiping them, and only then a worker starts
        own_redis.restart()
        worker_factory(own_redis.url, pool="threads", concurrency=4)
        # Then the dispatcher sees the restart, sends the read-only calls again, and they run
        results = fut.result(timeout=30)
    assert [r.status for r in results] == ["ok"] * 8, results


def _signed_task(run_id: str, call: ToolCall, deadline: float) -> ToolTask:
    """A signed message body for ``call`` under ``fail``, as a dispatcher with SECRET sends it."""
    task = ToolTask(run_id=run_id, call=call, timeout_secs=5, max_attempts=1, initial_backoff_secs=0.5,
                    max_backoff_secs=30, jitter=0.25, on_tool_exception="fail", max_result_chars=1000,
                    deadline=deadline)
    return sign(task, SECRET)


def test_a_replayed_message_of_a_call_that_failed_the_turn_never_runs_it_again(worker_factory) -> None:  # type: ignore[no-untyped-def]
    # Given signed workers, and a call under "fail" whose tool raised: its outcome is filed
    w = worker_factory(pool="threads", concurrency=2, extra_env={"CRIOGENAI_SIGNING_SECRET": SECRET})
    k, run_id = key(), f"run-{key()}"
    call = ToolCall(id="c", name="count_then_raise", arguments={"key": k})
    settings = Settings(broker_url=fleet_url(), lease_secs=2.0, signing_secret=SECRET)
    app = create_app(settings)
    client = redis.Redis.from_url(fleet_url())
    task = _signed_task(run_id, call, time.time() + 3)
    send_call(app, task, "criogenai")
    wait_for(lambda: client.hexists(Keys().failed(run_id), "c"), what="the failure to be filed")
    assert fleet_tools.runs(k) == 1

    def skipped() -> int:
        return w.output().count(f"call {run_id}/c not run")

    # When the captured message is replayed before its deadline, then after it
    send_call(app, task, "criogenai")
    wait_for(lambda: skipped() == 1, what="the replay within the deadline to be refused")
    wait_for(lambda: time.time() > task.deadline + 0.1, what="the call's deadline to pass")
    send_call(app, task, "criogenai")
    wait_for(lambda: skipped() == 2, what="the replay past the deadline to be refused")
    # Then neither ran the tool again
    assert fleet_tools.runs(k) == 1
    # And re-dispatching the turn (what Agent.retry does) still runs it again
    with make_dispatcher(settings=settings, on_tool_exception="fail") as d, pytest.raises(ToolFailed):
        d.run_turn_sync([call], run_id=run_id)
    assert fleet_tools.runs(k) == 2


def test_copies_of_a_call_reported_lost_never_run_later(worker_factory) -> None:  # type: ignore[no-untyped-def]
    # Given a call whose only worker is SIGKILLed while running it
    a = worker_factory(pool="threads", concurrency=2)
    k, run_id = key(), f"run-{key()}"
    client = redis.Redis.from_url(fleet_url())
    with make_dispatcher() as d, concurrent.futures.ThreadPoolExecutor(1) as ex:
        call = ToolCall(id="c", name="sleep_for", arguments={"seconds": 1, "key": k})
        fut = ex.submit(d.run_turn_sync, [call], run_id=run_id)
        wait_for(lambda: fleet_tools.runs(k) == 1, what="the call to start")
        a.kill(signal.SIGKILL)
        # When the turn reports it lost, while the copies its dispatcher sent again are queued
        [r] = fut.result(timeout=60)
    assert r.status == "lost", r
    queued = client.llen("criogenai")
    assert queued >= 1, "no copy was left queued: the test proves nothing"
    # And a worker starts later and takes them
    b = worker_factory(pool="threads", concurrency=2)
    wait_for(lambda: b.output().count(f"call {run_id}/c not run") == queued, timeout=30,
             what="every queued copy to be taken and refused")
    # Then none ran the tool, and nothing is filed after the model was told "lost"
    assert fleet_tools.runs(k) == 1
    assert not client.hexists(Keys().results(run_id), "c")


def test_a_stopped_worker_that_resumes_after_its_lease_cannot_file_over_the_run_that_replaced_it(  # type: ignore[no-untyped-def]
    worker_factory,
) -> None:
    # Given a call running on worker A, and a second worker B
    a = worker_factory(pool="threads", concurrency=2)
    b = worker_factory(pool="threads", concurrency=2)
    k, run_id = key(), f"run-{key()}"
    with make_dispatcher() as d, concurrent.futures.ThreadPoolExecutor(1) as ex:
        call = ToolCall(id="c", name="sleep_for", arguments={"seconds": 3, "key": k})
        fut = ex.submit(d.run_turn_sync, [call], run_id=run_id)
        wait_for(lambda: fleet_tools.runs(k) == 1, what="the call to start")
        ran_first_on_a = "sleep_for" in a.output()
        first, second = (a, b) if ran_first_on_a else (b, a)
        # When the first worker is stopped (SIGSTOP) past its lease, the call runs again on the
        # other, and the first resumes while that run goes on, its own run now over
        first.kill(signal.SIGSTOP)
        wait_for(lambda: fleet_tools.runs(k) == 2, what="the call to run again on the other worker")
        first.kill(signal.SIGCONT)  # its sleep is over: it finishes at once, the other 3 s later
        [r] = fut.result(timeout=30)
    # Then the result filed and returned is the second run's: the stale finish was refused
    assert r.status == "ok", r
    assert json.loads(r.content)["pid"] == second.proc.pid
    stored = json.loads(redis.Redis.from_url(fleet_url()).hget(Keys().results(run_id), "c"))
    assert json.loads(stored["content"])["pid"] == second.proc.pid


@pytest.mark.parametrize("records", [False, True])
def test_a_finished_call_leaves_only_its_entry_in_the_runs_results(worker_factory, records: bool) -> None:  # type: ignore[no-untyped-def]
    # Given a worker with or without Celery's result records
    env = {"CRIOGENAI_CELERY_RESULT_RECORDS": "1"} if records else {}
    worker_factory(pool="threads", concurrency=4, extra_env=env)
    client = redis.Redis.from_url(fleet_url())
    runs = [f"run-{key()}" for _ in range(5)]
    # When 5 turns of 10 calls finish (retried ones among them)
    with make_dispatcher() as d:
        for run_id in runs:
            calls = [ToolCall(id=f"c{i}", name="flaky_read", arguments={"key": key(), "fail_times": i % 2})
                     for i in range(10)]
            assert {r.status for r in d.run_turn_sync(calls, run_id=run_id)} == {"ok"}
    wait_for(lambda: client.llen("criogenai") == 0 and client.hlen("unacked") == 0,
             what="every message to be acknowledged")
    # Then Redis holds each run's results hash, Celery's record of each call only when asked,
    # and nothing else of them (everything of a run is under "crg:{<run>}:"): no claim, no start count
    left = {k.decode() for k in client.scan_iter("*") if k.startswith((b"crg:{", b"celery-task-meta-"))}
    assert {k for k in left if not k.startswith("celery-task-meta-")} == {Keys().results(r) for r in runs}
    assert len([k for k in left if k.startswith("celery-task-meta-")]) == (50 if records else 0)
