"""Durable turns under real faults: killed workers and dispatchers, duplicates, Redis restarts.

Every test counts the tools' real runs in Redis (see tests/fleet_tools.py): "once" means a count
of 1. Finished calls are exactly-once; calls that were running when their process died are
at-least-once.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import redis
from kombu import Connection

from criogenai import Dispatcher, Limits, Retry, Settings, ToolCall
from criogenai._keys import Keys, task_id
from criogenai._message import send_call
from criogenai._wire import ToolTask
from criogenai.worker import create_app
from tests import fleet_tools
from tests.conftest import ROOT, fleet_url, key, make_dispatcher, wait_for

pytestmark = pytest.mark.fault


@pytest.fixture(autouse=True)
def _clean_fleet_db(redis_up: None) -> None:
    redis.Redis.from_url(fleet_url()).flushdb()


def _task(call: ToolCall) -> ToolTask:
    """A message body for ``call`` in run "r", as a dispatcher would send it (one attempt)."""
    return ToolTask(run_id="r", call=call, timeout_secs=5, max_attempts=1, initial_backoff_secs=0,
                    max_backoff_secs=0, jitter=0, on_tool_exception="return_to_model",
                    max_result_chars=100, deadline=time.time() + 60)


def _echo_tasks(n: int) -> list[ToolTask]:
    return [_task(ToolCall(id=f"c{i}", name="echo", arguments={"text": str(i)})) for i in range(n)]


def _consume(channel: Any, queue: str) -> list[tuple[Any, Any]]:
    """Consume ``queue`` on a kombu channel with a prefetch window of 10; (body, message) pairs
    arrive in the returned list as the connection drains events."""
    from kombu import Consumer, Queue

    got: list[tuple[Any, Any]] = []
    channel.basic_qos(0, 10, False)
    Consumer(channel, [Queue(queue, routing_key=queue)], accept=["json"],
             callbacks=[lambda body, message: got.append((body, message))]).consume()
    return got




def holder_pid(run_id: str, call_id: str) -> int | None:
    """The process running a call now, from its claim (``run:<host>:<pid>:<nonce>``)."""
    held = redis.Redis.from_url(fleet_url()).get(Keys("crg").claim(run_id, call_id))
    if held is None or not held.startswith(b"run:"):
        return None
    return int(held.split(b":")[2])


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_call_whose_worker_is_killed_runs_again_on_another_worker(worker_factory, pool: str) -> None:
    # Given two live workers, and a call running on one of them
    k, run_id = key(), key()
    workers = [worker_factory(pool=pool, concurrency=2) for _ in range(2)]
    d = make_dispatcher()
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(d.run_turn_sync, [ToolCall(id="slow", name="sleep_for",
                                                   arguments={"seconds": 3, "key": k})], run_id=run_id)
        wait_for(lambda: holder_pid(run_id, "slow") is not None, what="the call to start")
        pid = holder_pid(run_id, "slow")
        [a] = [w for w in workers if pid is not None and os.getpgid(pid) == w.proc.pid]
        # When its worker dies whole (main process and pool children) with SIGKILL
        killed_at = time.monotonic()
        a.kill(signal.SIGKILL)
        [r] = fut.result(timeout=30)
    elapsed = time.monotonic() - killed_at
    d.close()
    # Then the other runs the call again within the lease bound, and the turn completes
    assert r.status == "ok", r
    assert fleet_tools.runs(k) == 2
    assert r.attempts == 2
    assert elapsed < 2.0 + 2 + 3 + 3, f"recovery took {elapsed:.1f} s"


def test_calls_sent_again_after_their_worker_died_wait_their_turn_behind_a_long_queue(worker_factory) -> None:
    # Given a worker running the first calls of a long turn
    k = key()
    first = worker_factory(pool="threads", concurrency=8)
    calls = [ToolCall(id=f"c{i}", name="sleep_for", arguments={"seconds": 0.4, "key": f"{k}-{i}"})
             for i in range(80)]
    limits = Limits(max_calls_per_turn=80, max_calls_in_flight_per_turn=80, queue_wait_secs=120)
    with make_dispatcher(limits=limits) as d, concurrent.futures.ThreadPoolExecutor(1) as ex:  # type: ignore[attr-defined]
        turn = ex.submit(d.run_turn_sync, calls)
        wait_for(lambda: fleet_tools.runs(f"{k}-0") == 1, what="the first calls to start")
        # When it dies, and a smaller worker is left with the rest (about 14 s of queue)
        first.kill(signal.SIGKILL)
        worker_factory(pool="threads", concurrency=2)
        results = turn.result(timeout=120)
    # Then the calls it was running are sent again and wait their turn: a copy waiting in the
    # queue is not a run that died again (each check took it for one: "kept dying", lost)
    assert [r.status for r in results] == ["ok"] * 80, [(r.call_id, r.content) for r in results
                                                       if r.status != "ok"][:3]


def test_a_redispatched_turn_does_not_rerun_finished_calls(worker_factory, tmp_path) -> None:
    # Given an agent process that dispatched a turn and was killed with SIGKILL mid-turn
    worker_factory(pool="threads", concurrency=6)
    run_id, keys = f"run-{key()}", [key() for _ in range(4)]
    calls = [{"id": f"fast{i}", "name": "count", "arguments": {"key": keys[i]}} for i in range(3)]
    calls.append({"id": "slow", "name": "sleep_for", "arguments": {"seconds": 2.5, "key": keys[3]}})
    script = textwrap.dedent(f"""
        from criogenai import Settings
        from tests.conftest import make_dispatcher
        d = make_dispatcher()
        d.run_turn_sync({json.dumps(calls)}, run_id={run_id!r})
    """)
    agent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    wait_for(lambda: all(fleet_tools.runs(k) == 1 for k in keys), what="all calls to start")
    agent.send_signal(signal.SIGKILL)
    agent.wait(10)
    # When a new process dispatches the same turn with the same run id
    with make_dispatcher() as d:
        results = d.run_turn_sync(calls, run_id=run_id)
    # Then every call has its result, and no call ran twice
    assert [r.status for r in results] == ["ok"] * 4, results
    assert [fleet_tools.runs(k) for k in keys] == [1, 1, 1, 1]
    assert [json.loads(r.content)["n"] for r in results[:3]] == [1, 1, 1]


def test_the_same_call_published_twice_runs_once(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=4)
    worker_factory(pool="prefork", concurrency=2)
    k, run_id = key(), f"run-{key()}"
    settings = Settings(broker_url=fleet_url(), lease_secs=2.0)
    app = create_app(settings)
    payload = ToolTask(run_id=run_id, call=ToolCall(id="dup", name="count", arguments={"key": k}),
                       timeout_secs=10, max_attempts=3, initial_backoff_secs=0.1, max_backoff_secs=1,
                       jitter=0.1, on_tool_exception="return_to_model", max_result_chars=1000,
                       deadline=time.time() + 60)
    for _ in range(3):
        send_call(app, payload, "criogenai")
    time.sleep(1.0)
    with make_dispatcher() as d:
        [r] = d.run_turn_sync([payload.call], run_id=run_id)
    time.sleep(0.5)
    assert r.status == "ok" and json.loads(r.content)["n"] == 1
    assert fleet_tools.runs(k) == 1


def test_two_dispatchers_sending_the_same_turn_get_one_run_and_equal_results(worker_factory) -> None:
    worker_factory(pool="threads", concurrency=4)
    k, run_id = key(), f"run-{key()}"
    call = ToolCall(id="c", name="sleep_for", arguments={"seconds": 0.5, "key": k})
    with make_dispatcher() as d1, make_dispatcher() as d2, concurrent.futures.ThreadPoolExecutor(2) as ex:
        f1 = ex.submit(d1.run_turn_sync, [call], run_id=run_id)
        f2 = ex.submit(d2.run_turn_sync, [call], run_id=run_id)
        r1, r2 = f1.result(30)[0], f2.result(30)[0]
    assert r1.status == r2.status == "ok"
    assert r1.content == r2.content
    assert fleet_tools.runs(k) == 1


def test_a_tool_that_kills_its_process_runs_a_bounded_number_of_times(worker_factory) -> None:
    worker_factory(pool="prefork", concurrency=2)
    k = key()
    with make_dispatcher() as d:
        [r] = d.run_turn_sync([ToolCall(id="d", name="die", arguments={"key": k})])
        assert r.status == "lost"
        assert "died" in r.content
        # and the fleet keeps serving
        [ok] = d.run_turn_sync([ToolCall(id="e", name="echo", arguments={"text": "still here"})])
    assert ok.content == "still here"
    assert fleet_tools.runs(k) == 3  # 1 allowed run + 2 lost runs, then it ends


def test_a_retry_waiting_longer_than_the_visibility_timeout_runs_once(worker_factory) -> None:  # type: ignore[no-untyped-def]
    # Given two workers and a read-only call whose retry waits 8 s: Celery holds the retry's
    # message unacknowledged until then, longer than a 2 s visibility timeout
    workers = [worker_factory(pool="threads", concurrency=2,
                              extra_env={"CRIOGENAI_VISIBILITY_TIMEOUT_SECS": "2"}) for _ in range(2)]
    k = key()
    with (make_dispatcher(tool_retry=Retry(max_attempts=3, initial_backoff=8, jitter=0)) as d,
          concurrent.futures.ThreadPoolExecutor(1) as ex):
        fut = ex.submit(d.run_turn_sync, [ToolCall(id="c", name="flaky_read",
                                                   arguments={"key": k, "fail_times": 1})])
        wait_for(lambda: fleet_tools.runs(k) == 1, what="the first, failing run")
        time.sleep(3)
        # When the broker redelivers it (what kombu's workers do every ~100 s; done here at once)
        with Connection(fleet_url(), transport_options={"visibility_timeout": 2}) as conn:
            conn.default_channel.qos.restore_visible(num=100, interval=1)
        [r] = fut.result(timeout=30)
    time.sleep(1)  # a copy held by the other worker fires at the same countdown
    logs = "".join(w.output() for w in workers)
    assert logs.count("tool:flaky_read[") - logs.count("] retry:") - logs.count("] succeeded") >= 3, \
        "the retry was not redelivered: the test proves nothing"
    # Then the copies did not run it again: one failure, one success
    assert (r.status, r.attempts) == ("ok", 2), r
    assert fleet_tools.runs(k) == 2


def test_poison_messages_are_refused_and_the_worker_keeps_serving(worker_factory) -> None:
    # Celery's result records on, to read what the worker stored for each refused message
    w = worker_factory(pool="threads", concurrency=2, extra_env={"CRIOGENAI_CELERY_RESULT_RECORDS": "1"})
    client = redis.Redis.from_url(fleet_url())
    app = create_app(Settings(broker_url=fleet_url()))
    app.conf.accept_content = ["json", "pickle"]  # the sender may; the worker must not
    k = key()
    # garbage bytes, a pickled message, a wrong shape, an unknown version, a forged tool name
    client.lpush("criogenai", b"\x00\xffnot json at all")
    app.send_task("criogenai.call", kwargs={"task": {"run_id": "r"}}, queue="criogenai",
                  serializer="pickle", task_id="poison-pickle")
    app.send_task("criogenai.call", kwargs={"task": {"nonsense": True}}, queue="criogenai",
                  task_id="poison-shape")
    good = _task(ToolCall(id="x", name="count", arguments={"key": k}))
    v2 = {**good.model_dump(mode="json"), "v": 2}
    app.send_task("criogenai.call", kwargs={"task": v2}, queue="criogenai", task_id="poison-v2")
    forged = good.model_copy(update={"call": ToolCall(id="y", name="celery.backend_cleanup")})
    app.send_task("criogenai.call", kwargs={"task": forged.model_dump(mode="json")},
                  queue="criogenai", task_id="poison-name")
    app.send_task("celery.backend_cleanup", queue="criogenai", task_id="poison-celery-task")
    with make_dispatcher() as d:
        [r] = d.run_turn_sync([ToolCall(id="after", name="echo", arguments={"text": "served"})])
    assert r.content == "served"
    wait_for(lambda: client.llen("criogenai") == 0, what="the queue to drain")
    assert fleet_tools.runs(k) == 0, "a refused message ran a tool"
    log = w.output()
    assert "not a criogenai call" in log
    assert "ContentDisallowed" in log or "disallowed" in log.lower()
    shape = json.loads(client.get("celery-task-meta-poison-shape"))
    assert shape["status"] == "FAILURE"
    # results are filed under the call's own task id (run id + call id), whatever the message said
    forged_meta = json.loads(client.get(f"celery-task-meta-{task_id('r', 'y')}"))
    assert forged_meta["status"] == "FAILURE"  # the call failed: CallFailed, status first
    assert forged_meta["result"]["exc_message"][0] == "unknown_tool"
    assert w.proc.poll() is None


def test_a_redis_restart_mid_turn_ends_every_call_and_the_fleet_recovers(worker_factory, own_redis) -> None:
    worker_factory(own_redis.url, pool="threads", concurrency=4)
    settings = Settings(broker_url=own_redis.url, lease_secs=2.0)
    with Dispatcher(fleet_tools_registry(), settings=settings,
                    limits=Limits(queue_wait_secs=8, no_worker_secs=3)) as d:
        calls = [ToolCall(id=f"s{i}", name="sleep_for", arguments={"seconds": 2}) for i in range(3)]
        calls += [ToolCall(id=f"r{i}", name="echo", arguments={"text": "x"}) for i in range(3)]
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(d.run_turn_sync, calls)
            time.sleep(0.7)
            started = time.monotonic()
            own_redis.restart()
            results = fut.result(timeout=60)
        elapsed = time.monotonic() - started
        statuses = {r.call_id: r.status for r in results}
        assert set(statuses.values()) <= {"ok", "lost", "not_started"}, statuses
        assert elapsed < 30
        # the workers and the dispatcher reconnect by themselves
        deadline = time.monotonic() + 30
        while True:
            [r] = d.run_turn_sync([ToolCall(id=f"after-{key()}", name="echo", arguments={"text": "back"})])
            if r.status == "ok" or time.monotonic() > deadline:
                break
        assert r.content == "back"


def fleet_tools_registry():  # type: ignore[no-untyped-def]
    from criogenai.tools import ToolRegistry

    return ToolRegistry.from_modules(["tests.fleet_tools"])


def test_soak_of_2000_calls_on_3_workers_with_one_killed_and_restarted(worker_factory) -> None:
    # (a fleet agreeing on a 3 s heartbeat TTL: what the dead worker had taken comes back sooner)
    beat = {"CRIOGENAI_HEARTBEAT_TTL_SECS": "3"}
    workers = [worker_factory(pool="threads", concurrency=8, extra_env=beat) for _ in range(3)]
    keys = [key() for _ in range(2000)]
    calls = [ToolCall(id=f"c{i}", name="count", arguments={"key": k}) for i, k in enumerate(keys)]
    settings = Settings(broker_url=fleet_url(), lease_secs=2.0, heartbeat_ttl_secs=3)
    with (
        make_dispatcher(limits={"max_calls_per_turn": 200}, settings=settings) as d,
        concurrent.futures.ThreadPoolExecutor(10) as ex,
    ):
        futures = [ex.submit(d.run_turn_sync, calls[i:i + 200]) for i in range(0, 2000, 200)]
        wait_for(lambda: sum(1 for f in futures if f.done()) >= 2, timeout=60, what="progress")
        workers[0].kill(signal.SIGKILL)
        worker_factory(pool="threads", concurrency=8, extra_env=beat)
        results = [r for f in futures for r in f.result(timeout=120)]
    assert len(results) == 2000
    assert all(r.status == "ok" for r in results), {r.status for r in results}
    counts = [fleet_tools.runs(k) for k in keys]
    assert min(counts) == 1
    # only calls that were running on the killed worker (8 slots) may have run twice
    assert sum(1 for c in counts if c > 1) <= 8
    assert max(counts) <= 2


def test_every_key_the_fleet_leaves_behind_expires(worker_factory) -> None:  # type: ignore[no-untyped-def]
    from criogenai import Agent, Approvals, FakeModel, ResultCache
    from tests.conftest import make_dispatcher as tools_dispatcher

    worker_factory(pool="threads", concurrency=4)
    settings = Settings(broker_url=fleet_url(), lease_secs=2.0)
    cache = ResultCache(ttl_secs=600, settings=settings)
    with make_dispatcher(tool_retry=Retry(max_attempts=2, initial_backoff=0.05), approve=["flaky_write"],
                         before_tool=[cache.before], after_tool=[cache.after]) as d:
        for _ in range(5):
            d.run_turn_sync([ToolCall(id=f"c{i}", name="flaky_read",
                                      arguments={"key": key(), "fail_times": i % 2}) for i in range(20)])
        # approvals: one asked, decided and resumed; cache: one read twice
        asked = [ToolCall(id="w", name="flaky_write", arguments={"key": key(), "fail_times": 0}),
                 ToolCall(id="e", name="echo", arguments={"text": "cached"})]
        [waiting, _] = d.run_turn_sync(asked, run_id="run-expiry")
        assert waiting.status == "pending_approval"
        Approvals(settings).approve("run-expiry", "w")
        assert [r.status for r in d.run_turn_sync(asked, run_id="run-expiry")] == ["ok", "ok"]
    # an agent's run record
    tools = list(tools_dispatcher().registry)  # type: ignore[attr-defined]
    agent = Agent(FakeModel([[{"id": "a", "name": "echo", "arguments": {"text": "x"}}], "done"]),
                  tools=tools, settings=settings)
    try:
        assert agent.run_sync("go").output == "done"
    finally:
        agent.close()

    client = redis.Redis.from_url(fleet_url())
    without_ttl = [k.decode() for k in client.scan_iter("*") if client.ttl(k) == -1]
    # kombu's exchange bindings are a fixed handful; everything per call, run, approval and cache
    # entry must expire
    leftovers = [k for k in without_ttl if not k.startswith("_kombu.binding") and not k.startswith("test:")]
    assert leftovers == []
    assert any(k.startswith(b"crg:cache:") for k in client.scan_iter("crg:*")), "the cache wrote nothing"


def test_filing_a_result_acknowledges_its_message_in_the_same_step(redis_up: None) -> None:
    """The message leaves kombu's unacknowledged set with the result, atomically: a worker dying
    between the two can neither lose the result nor get the finished call redelivered."""
    from criogenai import ToolResult
    from criogenai._keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX
    from criogenai.store import RedisLedger

    db = redis.Redis.from_url(fleet_url())
    db.flushdb()

    def unacked(tag: str) -> tuple[bool, bool]:
        return db.hexists(KOMBU_UNACKED, tag), db.zscore(KOMBU_UNACKED_INDEX, tag) is not None

    for acks, expected in ((True, (False, False)), (False, (True, True))):
        tag = key()
        db.hset(KOMBU_UNACKED, tag, "[]")
        db.zadd(KOMBU_UNACKED_INDEX, {tag: time.time()})
        ledger = RedisLedger(fleet_url(), broker_acks=acks)
        result = ToolResult(call_id="c", name="echo", run_id=f"r-{tag}", status="ok", content="x")
        assert ledger.finish(result, result.run_id, None, None, done=True, delivery_tag=tag)
        assert ledger.finished(result.run_id, ["c"])["c"].content == "x"
        assert unacked(tag) == expected


def test_messages_a_worker_pops_together_stay_restorable_until_each_is_acknowledged(redis_up: None) -> None:
    """The worker's transport pops up to its prefetch window of messages in one BLMPOP. Every
    one is kept in kombu's unacknowledged set, as kombu itself would keep it, before any is
    handed on, so a worker that dies holding them loses none."""
    from criogenai.dispatcher._publish import RedisPublisher
    from criogenai.worker._transport import TRANSPORT

    db = redis.Redis.from_url(fleet_url())
    queue = f"batch-{key()}"
    app = create_app(Settings(broker_url=fleet_url()))
    calls = _echo_tasks(5)
    RedisPublisher(app, db).publish([(c, queue) for c in calls])
    with Connection(fleet_url(), transport=TRANSPORT) as conn:
        channel = conn.channel()
        got = _consume(channel, queue)
        conn.drain_events(timeout=5)
        assert len(got) == 5, "the five queued messages did not come in one pop"
        assert db.llen(queue) == 0
        assert [body[1]["task"]["call"]["id"] for body, _ in got] == [f"c{i}" for i in range(5)]
        for _, message in got:
            stored, exchange, routing_key = json.loads(db.hget("unacked", message.delivery_tag))
            assert stored == message._raw and routing_key == queue and exchange == ""
            assert db.zscore("unacked_index", message.delivery_tag) is not None
        got[0][1].ack()
        got[1][1].ack()
        assert db.hlen("unacked") == 3 and db.zcard("unacked_index") == 3
        channel.qos.restore_unacked()  # what kombu does for a worker that died holding them
        restored = [json.loads(m) for m in db.lrange(queue, 0, -1)]
        assert sorted(m["headers"]["id"] for m in restored) == sorted(
            task_id("r", f"c{i}") for i in range(2, 5)
        )
    db.delete(queue)


def test_with_a_kombu_global_key_prefix_the_transport_keeps_kombus_own_bookkeeping(redis_up: None) -> None:
    """criogenai's lighter unacked bookkeeping, batched pops and acks-with-the-result write
    kombu's default key names; with a ``global_keyprefix`` they step aside for kombu's own code,
    so every entry is written and removed under the prefix."""
    from kombu import Consumer, Producer, Queue

    from criogenai.worker._transport import TRANSPORT, acked_with_result

    db = redis.Redis.from_url(fleet_url())
    prefix, queue = f"pfx-{key()}:", f"q-{key()}"
    options = {"global_keyprefix": prefix}
    got = []
    with Connection(fleet_url(), transport=TRANSPORT, transport_options=options) as conn:
        channel = conn.channel()
        channel.basic_qos(0, 10, False)
        q = Queue(queue, routing_key=queue)
        producer = Producer(channel, serializer="json")
        for i in range(3):  # Celery task messages: the transport refuses anything else
            producer.publish([[], {"n": i}, None], routing_key=queue, declare=[q],
                             headers={"task": "t", "id": f"t{i}"})
        consumer = Consumer(channel, [q], accept=["json"],
                            callbacks=[lambda body, message: got.append((body, message))])
        consumer.consume()
        for _ in range(3):
            conn.drain_events(timeout=5)
        assert [body[1]["n"] for body, _ in got] == [0, 1, 2]
        assert db.hlen(f"{prefix}unacked") == 3 and db.zcard(f"{prefix}unacked_index") == 3
        assert not db.exists("unacked") and not db.exists("unacked_index"), "wrote kombu's unprefixed keys"
        got[0][1].ack()
        acked_with_result(got[1][1].delivery_tag)  # the ledger wrote nothing under the prefix...
        got[1][1].ack()  # ...so kombu's own ack must remove the entry
        assert db.hlen(f"{prefix}unacked") == 1 and db.zcard(f"{prefix}unacked_index") == 1
        got[2][1].ack()
    for k in db.scan_iter(f"{prefix}*"):
        db.delete(k)


def test_a_popped_message_whose_body_cannot_be_decoded_is_refused_and_the_rest_are_delivered(
    redis_up: None,
) -> None:
    from criogenai.dispatcher._publish import RedisPublisher
    from criogenai.worker._transport import TRANSPORT

    db = redis.Redis.from_url(fleet_url())
    queue = f"batch-{key()}"
    app = create_app(Settings(broker_url=fleet_url()))
    publisher = RedisPublisher(app, db)
    calls = _echo_tasks(3)
    broken = json.loads(publisher.envelope(calls[1], queue))
    broken["body"] = "!!! not base64 !!!"
    envelopes = [publisher.envelope(calls[0], queue), json.dumps(broken), publisher.envelope(calls[2], queue)]
    db.lpush(queue, *envelopes)
    with Connection(fleet_url(), transport=TRANSPORT) as conn:
        channel = conn.channel()
        got = _consume(channel, queue)
        conn.drain_events(timeout=5)  # one pop takes all three; the broken one must not raise
        assert [body[1]["task"]["call"]["id"] for body, _ in got] == ["c0", "c2"]
        assert db.hlen("unacked") == 2, "the refused message's entry was kept (it would come back)"
        for _, message in got:
            message.ack()
        assert db.hlen("unacked") == 0 and db.llen(queue) == 0


def test_popped_messages_that_could_not_be_kept_go_back_in_their_order(redis_up: None) -> None:
    """If writing the unacked entries of a popped batch fails, the batch is pushed back to the
    end of the list it came from, where the next pop takes it again in the same order."""
    from criogenai.dispatcher._publish import RedisPublisher
    from criogenai.worker._transport import TRANSPORT, _decoded

    db = redis.Redis.from_url(fleet_url())
    queue = f"batch-{key()}"
    app = create_app(Settings(broker_url=fleet_url()))
    publisher = RedisPublisher(app, db)
    calls = _echo_tasks(4)
    publisher.publish([(c, queue) for c in calls])
    popped = db.lmpop(1, queue, direction="RIGHT", count=3)  # what a pop of three takes: c0, c1, c2
    with Connection(fleet_url(), transport=TRANSPORT) as conn:
        channel = conn.channel()
        channel._push_back(queue.encode(), _decoded(popped[1]))
        got = _consume(channel, queue)
        conn.drain_events(timeout=5)
        assert [body[1]["task"]["call"]["id"] for body, _ in got] == ["c0", "c1", "c2", "c3"]
        for _, message in got:
            message.ack()


@pytest.mark.parametrize("store", ["redis", "memory"])
def test_a_monitor_pass_sees_every_runs_finished_and_running_calls_at_once(
    redis_up: None, store: str
) -> None:
    from criogenai import ToolResult
    from criogenai.store._ledger import MemoryLedger, RedisLedger

    ledger = RedisLedger(fleet_url()) if store == "redis" else MemoryLedger()
    a, b = f"run-a-{key()}", f"run-b-{key()}"
    done = ToolResult(call_id="c1", name="echo", run_id=a, status="ok", content="x")
    assert ledger.claim(a, "c1", "tok", time.time() + 60).kind == "claimed"
    assert ledger.finish(done, a, "tok", None, done=True)
    assert ledger.claim(b, "c2", "tok", time.time() + 60).kind == "claimed"

    looks = ledger.look({a: ["c1", "c3"], b: ["c2"]})

    assert looks[a].finished == {"c1": done}
    assert looks[a].progress["c3"].state == "none" and looks[a].progress["c3"].starts == 0
    assert looks[b].finished == {}
    assert looks[b].progress["c2"].state == "running" and looks[b].progress["c2"].starts == 1
    for run, ids in ((a, ["c1", "c3"]), (b, ["c2"])):  # the same as asking run by run
        assert looks[run].finished == ledger.finished(run, ids)
        assert looks[run].progress == ledger.progress(run, ids)
