"""Faults at the edges of the one call runner: what a delivery leaves behind in the broker, the
admission rooms and the lease keeper when it ends in an unusual way."""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from pathlib import Path

from criogenai import Limits, ToolCall
from criogenai._wire import ToolTask
from criogenai.dispatcher._admission import Send
from criogenai.dispatcher._inprocess import InProcessEngine
from criogenai.store._ledger import RedisLedger
from criogenai.tools import ToolRegistry
from tests import fleet_tools
from tests.conftest import fleet_url, make_dispatcher, start_worker, wait_for
from tests.integration.test_security import KEYS, QUEUE, db, envelope, push, spare_port, task


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
