"""Faults at the edges of the one call runner: what a delivery leaves behind in the broker, the
admission rooms and the lease keeper when it ends in an unusual way."""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from criogenai import Limits, Settings, ToolCall, tool
from criogenai._keys import pop_breaks
from criogenai._wire import ToolTask
from criogenai.dispatcher._admission import Send
from criogenai.dispatcher._inprocess import InProcessEngine
from criogenai.runner import Answered, CallRunner, Delivery, NotRun
from criogenai.store._ledger import _CLAIM, _FINISH, RedisLedger
from criogenai.tools import ToolRegistry
from tests import fleet_tools
from tests.conftest import fleet_url, make_dispatcher, start_worker, wait_for
from tests.integration.test_security import KEYS, QUEUE, db, envelope, push, spare_port, task
from tests.reply_dropper import ReplyDropper, script_sha


def test_an_unknown_tool_call_is_answered_and_its_message_acknowledged(tmp_path: Path) -> None:
    """Else it stays in kombu's unacked hash, is restored after the visibility timeout and is
    refused again, for ever."""
    w = start_worker(fleet_url(), tmp_path, pool="threads", concurrency=2, queues=QUEUE)
    try:
        payload = task("no_such_tool", {})
        push(envelope(payload))
        wait_for(lambda: db().hget(KEYS.results(payload.run_id), "c1") is not None, what="the answer")
        wait_for(lambda: not [v for v in db().hvals("unacked") if payload.run_id.encode() in v],
                 timeout=5, what="the message to be acknowledged")
    finally:
        w.stop()


def test_a_run_id_sent_again_under_a_cap_joins_the_running_call_and_gets_the_rest(tmp_path: Path) -> None:
    """The second turn joins the first one's running call; its own admission room is freed with
    it, so its next call is not held behind the cap until it ends not_started."""
    w = start_worker(fleet_url(), tmp_path, pool="threads", concurrency=4)
    try:
        limits = Limits(max_calls_in_flight_per_turn=1, queue_wait_secs=4, tool_timeout_secs=10)
        with make_dispatcher(limits=limits) as d:  # type: ignore[attr-defined]
            k, rid = uuid.uuid4().hex, uuid.uuid4().hex
            calls = [ToolCall(id="s", name="sleep_for", arguments={"seconds": 1.5, "key": k}),
                     ToolCall(id="e", name="echo", arguments={"text": "hi"})]
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                first = pool.submit(d.run_turn_sync, calls, run_id=rid)
                wait_for(lambda: fleet_tools.runs(k) == 1, what="the first turn's call to start")
                second = d.run_turn_sync(calls, run_id=rid)
                assert [r.status for r in first.result(30)] == ["ok", "ok"]
            assert [r.status for r in second] == ["ok", "ok"]
            assert fleet_tools.runs(k) == 1
    finally:
        w.stop()


def test_an_embedded_turn_whose_redis_does_not_answer_ends_lost_within_its_bound() -> None:
    ledger = RedisLedger(f"redis://127.0.0.1:{spare_port()}/0", lease_secs=2.0)  # nothing listens
    engine = InProcessEngine(ToolRegistry([fleet_tools.echo]), ledger, Limits(queue_wait_secs=1.0))
    payload = ToolTask(run_id="r1", call=ToolCall(id="u", name="echo", arguments={"text": "x"}),
                       timeout_secs=1, max_attempts=1, initial_backoff_secs=0, max_backoff_secs=0,
                       jitter=0, on_tool_exception="return_to_model", max_result_chars=100,
                       deadline=time.time() + 1)
    try:
        future = engine.submit("r1", [Send(payload, QUEUE, False)], check_finished=False)
        [result] = future.result(timeout=60).values()
    finally:
        engine.close()
    assert result.status == "lost"


_gate = {"started": threading.Event(), "release": threading.Event()}


@tool
def gated() -> str:
    """Runs until the test lets it end."""
    _gate["started"].set()
    _gate["release"].wait(30)
    return "ran"


class Boom(Exception):
    pass


@tool
def raises() -> str:
    """Raises, every time."""
    raise Boom("no")


def _call(name: str, **over: Any) -> ToolTask:
    fields: dict[str, Any] = {
        "run_id": uuid.uuid4().hex, "call": ToolCall(id="c1", name=name, arguments={}),
        "timeout_secs": 20, "max_attempts": 1, "initial_backoff_secs": 0, "max_backoff_secs": 0,
        "jitter": 0, "on_tool_exception": "return_to_model", "max_result_chars": 1000,
        "deadline": time.time() + 60, **over,
    }
    return ToolTask.model_validate(fields)


def test_a_claim_whose_reply_was_lost_runs_at_once_and_another_delivery_still_waits() -> None:
    """Redis ran the claim and the connection broke before its answer came back; the ledger sends
    the claim again. That delivery's claim is its own: the call runs now, as its first run (not
    ``busy`` until its lease runs out). Another delivery of the call, even in the same process,
    is still ``busy``."""
    _gate["started"].clear()
    _gate["release"].clear()
    prefix = f"t{uuid.uuid4().hex[:6]}"
    with ReplyDropper(script_sha(_CLAIM)) as proxy:
        runner = CallRunner(ToolRegistry([gated]), RedisLedger(proxy.url(), prefix=prefix, lease_secs=30),
                            host="test")
        payload = _call("gated")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(runner.run, Delivery(payload))
            try:
                wait_for(lambda: _gate["started"].is_set() or first.done(), what="the first delivery")
                assert proxy.dropped.is_set()
                assert not first.done(), f"the first delivery did not run the call: {first.result()}"
                assert runner.run(Delivery(payload)) == NotRun("busy")
            finally:
                _gate["release"].set()
            step = first.result(timeout=20)
    assert isinstance(step, Answered)
    assert (step.result.status, step.result.content, step.result.attempts) == ("ok", "ran", 1)
    assert RedisLedger(fleet_url(), prefix=prefix).progress(payload.run_id, ["c1"])["c1"].starts == 0


@pytest.mark.parametrize("on_exception", ["return_to_model", "fail"])
def test_a_filing_whose_reply_was_lost_is_known_as_its_own_and_answers_once(on_exception: str) -> None:
    """Redis filed the result and the connection broke before its answer came back; the ledger
    files it again. That filing sees its own result: the call counts as filed by this run (the
    embedded engine keeps the tool's exception for the turn), and its dispatcher is answered once
    (a result that fails the turn is not pushed twice)."""
    prefix = f"t{uuid.uuid4().hex[:6]}"
    direct = RedisLedger(fleet_url(), prefix=prefix)
    with ReplyDropper(script_sha(_FINISH)) as proxy:
        runner = CallRunner(ToolRegistry([raises]), RedisLedger(proxy.url(), prefix=prefix, lease_secs=30),
                            host="test")
        reply_to = direct.keys.reply(uuid.uuid4().hex)
        payload = _call("raises", on_tool_exception=on_exception, reply_to=reply_to)
        step = runner.run(Delivery(payload))
        assert proxy.dropped.is_set()
    assert isinstance(step, Answered) and step.result.status == "exception"
    assert isinstance(step.error, Boom)
    replies = direct.pop_replies(reply_to, 1)
    assert [r.call_id for r in replies] == ["c1"]


def test_a_worker_whose_claim_reply_was_lost_runs_the_call_once_without_waiting_for_its_lease(
    tmp_path: Path,
) -> None:
    """The same through a real worker: its turn is answered well within the lease, by one run."""
    lease = 10.0
    with ReplyDropper(script_sha(_CLAIM)) as proxy:
        w = start_worker(proxy.url(), tmp_path, lease_secs=lease,
                         extra_env={"CRIOGENAI_TEST_COUNTER_URL": fleet_url()})
        try:
            settings = Settings(broker_url=fleet_url(), lease_secs=lease)
            with make_dispatcher(settings=settings) as d:  # type: ignore[attr-defined]
                k = uuid.uuid4().hex
                started = time.monotonic()
                [result] = d.run_turn_sync([ToolCall(id="c", name="count", arguments={"key": k})])
                took = time.monotonic() - started
        finally:
            w.stop()
    assert proxy.dropped.is_set()
    assert (result.status, result.attempts, fleet_tools.runs(k)) == ("ok", 1, 1)
    assert took < lease / 2, f"answered after {took:.1f} s"


def test_a_call_whose_pop_reply_a_worker_lost_is_sent_again_at_once_not_after_queue_wait(
    tmp_path: Path,
) -> None:
    """Redis took the message off the queue for a worker's pop, and the connection broke before
    the reply carrying it arrived: no worker holds it, not even as unacknowledged. The worker says
    so when it reconnects (the queue's pop-breaks counter), and the dispatcher, whose own
    connection never broke, sends the call again: it runs once, long before its queue wait."""
    breaks = pop_breaks("criogenai")
    with ReplyDropper(b"BLMPOP", reply=b"*2") as proxy:
        w = start_worker(proxy.url(), tmp_path, concurrency=4,
                         extra_env={"CRIOGENAI_TEST_COUNTER_URL": fleet_url()})
        before = int(db().get(breaks) or 0)
        try:
            with make_dispatcher(limits=Limits(queue_wait_secs=30)) as d:  # type: ignore[attr-defined]
                k = uuid.uuid4().hex
                [result] = d.run_turn_sync([ToolCall(id="c", name="count", arguments={"key": k})])
        finally:
            w.stop()
    assert proxy.dropped.is_set()
    assert (result.status, result.attempts, fleet_tools.runs(k)) == ("ok", 1, 1), result.content
    assert int(db().get(breaks) or 0) > before
    assert "the connection broke while popping criogenai" in w.output()  # (without: not_started at 30 s)
