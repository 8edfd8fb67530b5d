"""Plain Celery senders: send_task and group work with the call's own task id; other ids and chains
are refused with a log line saying why."""

from __future__ import annotations

import time
import uuid

import pytest
from celery import chain, group

from criogenai import Settings, ToolCall, task_id
from criogenai._wire import ToolTask
from criogenai.worker import create_app
from tests import fleet_tools
from tests.conftest import WorkerProcess, fleet_url, key, wait_for


def _body(run_id: str, call: ToolCall) -> dict[str, object]:
    task = ToolTask(run_id=run_id, call=call, timeout_secs=10, max_attempts=1, initial_backoff_secs=0.5,
                    max_backoff_secs=1, jitter=0, on_tool_exception="return_generic",
                    max_result_chars=100_000, deadline=time.time() + 60)
    return {"task": task.model_dump(mode="json")}


@pytest.fixture(scope="module")
def worker(tmp_path_factory, redis_up):  # type: ignore[no-untyped-def]
    from tests.conftest import start_worker

    # Plain Celery's AsyncResult reads Celery's result records, which the fleet keeps only when asked
    w = start_worker(fleet_url(), tmp_path_factory.mktemp("plain"), pool="threads", concurrency=4,
                     queues="criogenai", extra_env={"CRIOGENAI_CELERY_RESULT_RECORDS": "1"})
    yield w
    w.stop()


def test_send_task_with_the_calls_own_id_gives_its_result_to_asyncresult(worker: WorkerProcess) -> None:
    app = create_app(Settings(broker_url=fleet_url()))
    run_id = f"plain-{key()}"
    sent = app.send_task("criogenai.call", kwargs=_body(run_id, ToolCall(id="c1", name="echo",
                         arguments={"text": "from send_task"})), task_id=task_id(run_id, "c1"),
                         queue="criogenai")
    assert sent.get(timeout=20)["content"] == "from send_task"


def test_a_group_of_calls_with_their_own_ids_gives_every_result(worker: WorkerProcess) -> None:
    app = create_app(Settings(broker_url=fleet_url()))
    run_id = f"group-{key()}"
    calls = [ToolCall(id=f"g{i}", name="echo", arguments={"text": f"t{i}"}) for i in range(3)]
    sigs = [app.signature("criogenai.call", kwargs=_body(run_id, c), queue="criogenai")
            .set(task_id=task_id(run_id, c.id)) for c in calls]
    results = group(sigs).apply_async().get(timeout=20)
    assert [r["content"] for r in results] == ["t0", "t1", "t2"]


def test_a_message_with_an_id_of_its_own_is_refused_and_logged(worker: WorkerProcess) -> None:
    app = create_app(Settings(broker_url=fleet_url()))
    k, own = key(), str(uuid.uuid4())
    app.send_task("criogenai.call", kwargs=_body(f"own-{k}", ToolCall(id="c", name="count",
                  arguments={"key": k})), task_id=own, queue="criogenai")
    def refusal() -> str | None:
        lines = worker.output().splitlines()
        return next((line for line in lines if own in line and "refused" in line), None)

    wait_for(refusal, what="the refusal in the log")
    line = refusal() or ""
    assert "its task id is not the call's own" in line and task_id(f"own-{k}", "c") in line
    assert fleet_tools.runs(k) == 0


def test_a_chain_is_refused(worker: WorkerProcess) -> None:
    app = create_app(Settings(broker_url=fleet_url()))
    run_id, k = f"chain-{key()}", key()
    first, second = (ToolCall(id=c, name="count", arguments={"key": k}) for c in ("a", "b"))
    chain(
        app.signature("criogenai.call", kwargs=_body(run_id, first), queue="criogenai")
        .set(task_id=task_id(run_id, "a")),
        app.signature("criogenai.call", kwargs=_body(run_id, second), queue="criogenai", immutable=True)
        .set(task_id=task_id(run_id, "b")),
    ).apply_async()
    tid = task_id(run_id, "a")
    wait_for(lambda: tid in worker.output() and "follow-up tasks" in worker.output(), what="the refusal")
    assert fleet_tools.runs(k) == 0
