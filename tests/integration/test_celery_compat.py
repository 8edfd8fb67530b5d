"""criogenai stays a Celery citizen: stock messages on the way in, stock result records on the way out."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from typing import Any

import redis

from criogenai import Settings, ToolCall, ToolResult
from criogenai._keys import task_id
from criogenai._message import send_call
from criogenai._wire import ToolTask
from criogenai.dispatcher._publish import RedisPublisher
from criogenai.worker import create_app
from tests.conftest import PYTHONPATH, ROOT, WorkerProcess, fleet_url, make_dispatcher, wait_until_live

QUEUE = "contract-no-worker"


def _payload() -> ToolTask:
    return ToolTask(
        run_id="run-contract",
        call=ToolCall(id="call-1", name="echo", arguments={"text": "héllo", "n": [1, 2.5, None]}),
        timeout_secs=12.5,
        max_attempts=3,
        initial_backoff_secs=0.5,
        max_backoff_secs=30,
        jitter=0.25,
        on_tool_exception="return_generic",
        max_result_chars=100_000,
        reply_to="crg:reply:abc",
        deadline=time.time() + 300,
    )


def _decoded(raw: bytes) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(raw)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    props = message["properties"]
    # Differ by design: a fresh tag per message; kombu adds the reprs and a reply channel too.
    for key in ("delivery_tag", "argsrepr", "kwargsrepr", "reply_to"):
        props.pop(key, None)
    message["headers"].pop("origin")
    assert isinstance(message["headers"].pop("crg_sent_at"), float)  # for the queue-wait metric
    return message


def test_fast_publisher_message_equals_kombus_message(redis_up: None) -> None:
    client = redis.Redis.from_url(fleet_url())
    client.delete(QUEUE)
    app = create_app(Settings(broker_url=fleet_url()))
    payload = _payload()

    send_call(app, payload, QUEUE)
    RedisPublisher(app, client).publish([(payload, QUEUE)])

    raw_fast, raw_kombu = client.lrange(QUEUE, 0, -1)  # LPUSH: newest first
    client.delete(QUEUE)
    assert _decoded(raw_fast) == _decoded(raw_kombu)
    assert ToolTask.model_validate(_decoded(raw_fast)["body"][1]["task"]) == payload


def test_each_finished_call_has_celerys_own_result_record(worker_factory) -> None:  # type: ignore[no-untyped-def]
    # Given a turn run on a real worker that keeps Celery's result records (the setting)
    worker_factory(pool="threads", concurrency=2, extra_env={"CRIOGENAI_CELERY_RESULT_RECORDS": "1"})
    with make_dispatcher() as d:
        results = d.run_turn_sync([ToolCall(id=f"c{i}", name="echo", arguments={"text": f"t{i}"})
                                   for i in range(3)], run_id="run-celery-compat")
    assert [r.content for r in results] == ["t0", "t1", "t2"]
    # Then a stock AsyncResult reads each call's result from the Redis backend
    app = create_app(Settings(broker_url=fleet_url()))
    for r in results:
        stored = app.AsyncResult(task_id("run-celery-compat", r.call_id)).get(timeout=5)
        assert ToolResult.model_validate(stored) == r.model_copy(update={"artifact": None})


def test_without_the_setting_no_celery_result_record_is_kept(worker_factory) -> None:  # type: ignore[no-untyped-def]
    # Given a worker with the default settings
    worker_factory(pool="threads", concurrency=2)
    with make_dispatcher() as d:
        [r] = d.run_turn_sync([ToolCall(id="c", name="echo", arguments={"text": "t"})],
                              run_id="run-no-record")
    assert r.content == "t"
    # Then the result is kept once, with the run, and Celery knows nothing of the task
    app = create_app(Settings(broker_url=fleet_url()))
    assert app.AsyncResult(task_id("run-no-record", "c")).state == "PENDING"
    assert not redis.Redis.from_url(fleet_url()).exists(f"celery-task-meta-{task_id('run-no-record', 'c')}")



def test_a_plain_celery_worker_command_serves_the_tools_named_in_the_environment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given `celery -A criogenai.worker worker`, with the tool modules in CRIOGENAI_TOOLS
    name = "plain-celery-cmd@test"
    env = {**os.environ, "CRIOGENAI_BROKER_URL": fleet_url(), "CRIOGENAI_TOOLS": "tests.fleet_tools",
           "CRIOGENAI_TEST_COUNTER_URL": fleet_url(), "PYTHONPATH": PYTHONPATH}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "criogenai.worker", "worker", "--pool", "threads",
             "-c", "2", "-Q", "criogenai", "-n", name, "--without-gossip", "--without-mingle"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    worker = WorkerProcess(name, proc, log)
    try:
        wait_until_live(fleet_url(), name, worker)
        # When a turn is sent, then it runs there like on `criogenai worker`
        with make_dispatcher() as d:
            [r] = d.run_turn_sync([ToolCall(id="a", name="echo", arguments={"text": "via celery -A"})])
        assert (r.status, r.content) == ("ok", "via celery -A")
    finally:
        worker.stop()
