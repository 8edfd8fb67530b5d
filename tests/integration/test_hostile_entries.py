"""Hostile queue entries, on live workers of both pools: whatever anyone with write access to Redis
LPUSHes into a queue, the worker refuses that entry alone, frees its slot and keeps serving."""

from __future__ import annotations

import copy
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from criogenai import Limits, ToolCall
from criogenai._keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX, task_id
from tests import fleet_tools
from tests.conftest import OwnRedis, fleet_url, key, make_dispatcher, start_worker, wait_for
from tests.integration.test_security import body_of, envelope, task, with_body

QUEUE = "criogenai"
POOLS = ["prefork", "threads"]


@pytest.fixture(autouse=True)
def _clean_fleet_db(redis_up: None) -> None:
    db().flushdb()


def db() -> redis.Redis:
    return redis.Redis.from_url(fleet_url())


def push(*entries: bytes) -> None:
    db().lpush(QUEUE, *entries)


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def serves_every_call(d: Any, n: int = 3) -> None:
    calls = [ToolCall(id=f"c{i}", name="echo", arguments={"text": str(i)}) for i in range(n)]
    results = d.run_turn_sync(calls)
    assert [(r.status, r.content) for r in results] == [("ok", str(i)) for i in range(n)], results


def no_slot_held() -> None:
    """Nothing left in the queue or unacknowledged: every refused entry was released."""
    client = db()
    wait_for(lambda: (client.llen(QUEUE), client.zcard(KOMBU_UNACKED_INDEX), client.hlen(KOMBU_UNACKED))
             == (0, 0, 0), what="the queue and kombu's unacknowledged entries to empty")


def refusals(worker: Any) -> int:
    return sum(1 for line in worker.output().splitlines() if "ERROR" in line and "refused" in line)


@pytest.mark.parametrize("pool", POOLS)
def test_entries_that_break_kombus_decoder_are_refused_alone(worker_factory, pool: str) -> None:  # type: ignore[no-untyped-def]
    w = worker_factory(pool=pool, concurrency=2, queues=QUEUE)
    push(dumps({"__type__": "decimal", "__value__": "x"}),  # kombu's hook raises InvalidOperation
         b"[" * 200_000 + b"]" * 200_000)  # RecursionError
    wait_for(lambda: refusals(w) == 2, what="two refusals")
    with make_dispatcher() as d:
        serves_every_call(d)
    assert "Unrecoverable" not in w.output()
    assert w.proc.poll() is None
    no_slot_held()


def wrong_envelopes() -> list[bytes]:
    """Entries shaped like a call's envelope, each wrong in one place Celery trips over."""
    env = envelope(task("echo", {"text": "x"}))

    def edited(part: str, name: str, value: Any) -> bytes:
        out = copy.deepcopy(env)
        out[part][name] = value
        return dumps(out)

    no_id = copy.deepcopy(env)
    del no_id["headers"]["id"]
    return [
        edited("headers", "task", ["criogenai.call"]),
        dumps(with_body(env, body_of(env)[:2])),
        dumps(with_body(env, [[], {"task": 1}, "embed"])),
        dumps(no_id),
        edited("headers", "timelimit", [6.0, 5.0, 1.0]),
        edited("headers", "retries", "many"),
        edited("properties", "body_encoding", "rot13"),
    ]


@pytest.mark.parametrize("pool", POOLS)
def test_envelopes_of_the_wrong_shape_do_not_take_worker_slots(worker_factory, pool: str) -> None:  # type: ignore[no-untyped-def]
    w = worker_factory(pool=pool, concurrency=2, queues=QUEUE)
    entries = wrong_envelopes()
    push(*entries)  # more than the worker has slots
    wait_for(lambda: refusals(w) == len(entries), what="every entry to be refused")
    with make_dispatcher(limits=Limits(queue_wait_secs=10)) as d:
        serves_every_call(d, 4)
    no_slot_held()


@pytest.mark.parametrize("pool", POOLS)
def test_a_forged_expired_message_does_not_revoke_the_genuine_call(worker_factory, pool: str) -> None:  # type: ignore[no-untyped-def]
    w = worker_factory(pool=pool, concurrency=2, queues=QUEUE)
    run_id = f"run-{key()}"
    forged = envelope(task("echo", {"text": "forged"}).model_copy(update={"run_id": run_id}))
    forged["headers"]["id"] = task_id(run_id, "c0")  # the id the genuine call will have
    forged["headers"]["expires"] = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    push(dumps(forged))
    wait_for(lambda: db().llen(QUEUE) == 0, what="the worker to take the forged message")
    with make_dispatcher(limits=Limits(queue_wait_secs=10)) as d:
        [r] = d.run_turn_sync([ToolCall(id="c0", name="echo", arguments={"text": "genuine"})],
                              run_id=run_id)
    assert (r.status, r.content) == ("ok", "genuine"), r
    assert "revoked" not in w.output().lower()
    assert "expires" in w.output()  # the forged message's refusal names why
    no_slot_held()


_HOOKS = ["decimal", "datetime", "date", "time", "bytes", "uuid", "nonsense"]
hook = st.builds(lambda t, v: {"__type__": t, "__value__": v}, st.sampled_from(_HOOKS),
                 st.one_of(st.text(max_size=8), st.integers(), st.lists(st.integers(), max_size=2)))
"""A kombu type hook object with a value it cannot take."""
wrong = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                  st.text(max_size=12), st.lists(st.text(max_size=4), max_size=3),
                  st.dictionaries(st.text(max_size=4), st.integers(), max_size=2), hook)
"""A value of some type, mostly not the one its place wants."""


@st.composite
def hostile_entry(draw: st.DrawFn, env: dict[str, Any]) -> bytes:
    kind = draw(st.sampled_from(["bytes", "deep", "hook", "field", "body", "body-item"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "deep":
        n = draw(st.integers(1_000, 200_000))
        return draw(st.sampled_from([b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n]))
    if kind == "hook":
        return dumps(draw(hook))
    out = copy.deepcopy(env)
    out["headers"]["id"] = f"fuzz-{key()}"  # a forged entry never shares a genuine call's id
    if kind == "field":
        part = draw(st.sampled_from(["top", "headers", "properties", "delivery_info"]))
        where = {"top": out, "headers": out["headers"], "properties": out["properties"],
                 "delivery_info": out["properties"]["delivery_info"]}[part]
        where[draw(st.sampled_from(sorted(where)))] = draw(wrong)
        return dumps(out)
    body = body_of(env)
    if kind == "body":
        return dumps(with_body(out, draw(st.one_of(wrong, st.lists(wrong, max_size=4)))))
    body[draw(st.integers(0, 2))] = draw(wrong)
    return dumps(with_body(out, body))


@pytest.mark.parametrize("pool", POOLS)
def test_fuzzed_queue_entries_never_stop_a_worker_or_hold_its_slots(worker_factory, pool: str) -> None:  # type: ignore[no-untyped-def]
    w = worker_factory(pool=pool, concurrency=2, queues=QUEUE)
    k = key()
    env = envelope(task("count", {"key": k}))
    with make_dispatcher(limits=Limits(queue_wait_secs=15)) as d:

        @settings(max_examples=12, derandomize=True, deadline=None, database=None)
        @given(st.lists(hostile_entry(env), min_size=4, max_size=10))
        def between_valid_calls(entries: list[bytes]) -> None:
            push(*entries)
            serves_every_call(d, 2)
            assert w.proc.poll() is None, w.output()[-3000:]

        between_valid_calls()
    no_slot_held()
    assert "Unrecoverable" not in w.output()
    assert fleet_tools.runs(k) <= 1  # only a copy left valid by its edit may have run, once


def test_a_worker_that_dies_of_an_error_exits_non_zero(own_redis: OwnRedis, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A Redis user that may not pop: Celery's consumer stops with "Unrecoverable error".
    admin = redis.Redis(port=own_redis.port)
    admin.execute_command("ACL", "SETUSER", "nopop", "on", ">pw", "~*", "&*", "+@all", "-blmpop", "-brpop")
    w = start_worker(f"redis://nopop:pw@127.0.0.1:{own_redis.port}/0", tmp_path, pool="threads",
                     concurrency=2, queues=QUEUE, wait=False)
    try:
        code = w.proc.wait(60)
    finally:
        w.stop()
    assert "Unrecoverable error" in w.output()
    assert code != 0, "a supervisor's restart-on-failure would not restart this worker"


def test_a_call_whose_worker_retries_it_still_waits_its_countdown(worker_factory) -> None:  # type: ignore[no-untyped-def]
    # Genuine retries carry an ETA (Celery's own retry countdown): they are not refused.
    from criogenai import Retry

    worker_factory(pool="threads", concurrency=2, queues=QUEUE)
    k = key()
    with make_dispatcher(tool_retry=Retry(max_attempts=3, initial_backoff=0.3, jitter=0)) as d:
        started = time.monotonic()
        [r] = d.run_turn_sync([ToolCall(id="f", name="flaky_read", arguments={"key": k, "fail_times": 1})])
    assert (r.status, r.attempts) == ("ok", 2), r
    assert time.monotonic() - started >= 0.3
