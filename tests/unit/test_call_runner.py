"""The call runner: one step for each claim kind and each check, the same on the memory ledger
and on Redis. Both engines adapt these steps (the table in ``runner/_call.py``); the integration
parity test runs the same scenarios end to end on each engine."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from criogenai import ToolCall, ToolError, tool
from criogenai._signing import sign
from criogenai._wire import ToolResult, ToolTask
from criogenai.runner import Answered, CallRunner, Delivery, NotRun, Refused, RunAgain
from criogenai.runner._observe import CallObserver, current_call
from criogenai.store import Claim, Ledger, MemoryLedger, RedisLedger
from criogenai.tools import ToolRegistry
from tests.conftest import fleet_url, wait_for

seen_fields: list[dict[str, object]] = []


@tool
def echo(text: str) -> str:
    """Say it back, noting which call the runner said was running."""
    seen_fields.append(dict(current_call()))
    return text


@tool(read_only=True)
def flaky() -> str:
    """Always fails in a way that may work next time."""
    raise ToolError("try again", retryable=True)


@tool
def write_once() -> str:
    """Fails retryably, but writes: may not be retried."""
    raise ToolError("try again", retryable=True)


@pytest.fixture(params=["memory", "redis"])
def ledger(request: pytest.FixtureRequest) -> Iterator[Ledger]:
    if request.param == "memory":
        yield MemoryLedger(lease_secs=5)
    else:
        yield RedisLedger(fleet_url(), prefix=f"t{uuid.uuid4().hex[:6]}", lease_secs=5)


def task(name: str = "echo", arguments: object = None, **over: object) -> ToolTask:
    fields: dict[str, object] = {
        "run_id": uuid.uuid4().hex, "timeout_secs": 5, "max_attempts": 3, "initial_backoff_secs": 0.1,
        "max_backoff_secs": 1, "jitter": 0, "on_tool_exception": "return_to_model",
        "max_result_chars": 1000, "deadline": time.time() + 60,
        "call": ToolCall(id="c1", name=name, arguments={"text": "hi"} if arguments is None else arguments),
    }
    return ToolTask.model_validate({**fields, **over})


def runner(ledger: Ledger, secret: str | None = None) -> CallRunner:
    return CallRunner(ToolRegistry([echo, flaky, write_once]), ledger, host="test", signing_secret=secret)


def test_a_claimed_call_runs_and_its_result_is_filed(ledger: Ledger) -> None:
    t = task()
    seen_fields.clear()
    step = runner(ledger).run(Delivery(t, delivery_id="d1"))
    assert isinstance(step, Answered) and (step.result.status, step.result.content) == ("ok", "hi")
    assert ledger.finished(t.run_id, ["c1"])["c1"].content == "hi"
    assert seen_fields == [{"run_id": t.run_id, "call_id": "c1", "tool": "echo", "task_id": "d1"}]


def test_a_delivery_of_a_finished_call_does_not_run_it(ledger: Ledger) -> None:
    t = task()
    r = runner(ledger)
    r.run(Delivery(t))
    assert r.run(Delivery(t)) == NotRun("done")


def test_a_delivery_of_a_call_another_run_holds_waits_for_it(ledger: Ledger) -> None:
    t = task()
    ledger.claim(t.run_id, "c1", "someone-else", t.deadline)
    assert runner(ledger).run(Delivery(t)) == NotRun("busy")


def test_a_claim_or_filing_sent_again_by_its_delivery_is_its_own_and_another_deliverys_is_not(
    ledger: Ledger,
) -> None:
    """What the ledger's retries send again after a lost reply: the same token's claim is the same
    run (same attempt), its filing is filed once; any other token still finds busy, fenced or done."""
    t = task()
    assert ledger.claim(t.run_id, "c1", "d1", t.deadline) == Claim("claimed", 1)
    assert ledger.claim(t.run_id, "c1", "d1", t.deadline) == Claim("claimed", 1)
    assert ledger.claim(t.run_id, "c1", "d2", t.deadline) == Claim("busy")
    mine = ToolResult(call_id="c1", name="echo", run_id=t.run_id, status="ok", content="d1", attempts=1)
    other = mine.model_copy(update={"content": "d2"})
    assert not ledger.finish(other, t.run_id, "d2", None, done=True), "fenced: d1 holds the call"
    reply_to = f"reply-{uuid.uuid4().hex}"
    assert ledger.finish(mine, t.run_id, "d1", reply_to, done=True)
    assert ledger.finish(mine, t.run_id, "d1", reply_to, done=True)
    assert not ledger.finish(other, t.run_id, "d2", reply_to, done=True)
    assert [r.content for r in ledger.pop_replies(reply_to, 1)] == ["d1"]
    assert ledger.claim(t.run_id, "c1", "d1", t.deadline) == Claim("done")


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_claim_is_kept_from_the_moment_it_is_made_however_late_its_call_resumes(kind: str) -> None:
    """On a loaded event loop a claimed call may resume after a lease: the claim is renewed from
    the claim on (under the delivery's own token), so no other delivery can take it meanwhile."""
    ledger: Ledger = MemoryLedger(lease_secs=1.0) if kind == "memory" else RedisLedger(
        fleet_url(), prefix=f"t{uuid.uuid4().hex[:6]}", lease_secs=1.0)
    renewed: list[int] = []
    renew = ledger.renew

    def counted(claims):  # type: ignore[no-untyped-def]
        try:
            return renew(claims)
        finally:
            renewed.append(len(claims))

    ledger.renew = counted  # type: ignore[method-assign]
    r, t = runner(ledger), task()
    assert r._claim(t, r._delivery_token()).kind == "claimed"
    wait_for(lambda: len(renewed) >= 5, what="renewals over more than a lease")  # the call not resumed yet
    assert ledger.claim(t.run_id, "c1", "another-delivery", t.deadline) == Claim("busy")
    r.leases.drop(t.run_id, "c1")


def test_a_delivery_past_its_deadline_or_given_up_does_not_run(ledger: Ledger) -> None:
    assert runner(ledger).run(Delivery(task(deadline=time.time() - 1))) == NotRun("expired")
    t = task()
    ledger.give_up(t.run_id, "c1")
    assert runner(ledger).run(Delivery(t)) == NotRun("expired")


def test_a_delivery_of_a_cancelled_turn_files_cancelled_without_running(ledger: Ledger) -> None:
    t = task()
    ledger.cancel(t.run_id)
    seen_fields.clear()
    step = runner(ledger).run(Delivery(t))
    assert isinstance(step, Answered) and step.result.status == "cancelled"
    assert ledger.finished(t.run_id, ["c1"])["c1"].status == "cancelled"
    assert seen_fields == []


def test_a_retryable_failure_of_a_read_only_tool_runs_again_and_a_writing_tools_does_not(
    ledger: Ledger,
) -> None:
    step = runner(ledger).run(Delivery(task("flaky", {})))
    assert isinstance(step, RunAgain) and step.delay > 0
    step = runner(ledger).run(Delivery(task("write_once", {})))
    assert isinstance(step, Answered) and (step.result.status, step.result.attempts) == ("tool_error", 1)


def test_an_unknown_tool_is_answered_and_filed_and_an_unsigned_message_is_refused(ledger: Ledger) -> None:
    t = task("nope", {})
    step = runner(ledger).run(Delivery(t))
    assert isinstance(step, Answered) and step.result.status == "unknown_tool"
    unsigned = task()
    step = runner(ledger, secret="s" * 32).run(Delivery(unsigned))
    assert isinstance(step, Refused) and step.result.status == "not_started"
    assert ledger.finished(unsigned.run_id, ["c1"]) == {}, "a refused message must file nothing with a secret"
    signed = sign(task(), "s" * 32)
    step = runner(ledger, secret="s" * 32).run(Delivery(signed))
    assert isinstance(step, Answered) and step.result.status == "ok"


def test_the_engines_own_refusal_stops_the_call_before_it_runs(ledger: Ledger) -> None:
    seen_fields.clear()
    step = runner(ledger).run(Delivery(task(), refusal="asks for follow-up tasks"))
    assert isinstance(step, Refused) and "follow-up" in step.result.content
    assert seen_fields == []


def test_observers_are_told_of_each_run_and_end_and_one_that_fails_changes_nothing(ledger: Ledger) -> None:
    told: list[tuple[str, object]] = []

    class Broken(CallObserver):
        def call_ended(self, payload: ToolTask, result: object) -> None:
            raise RuntimeError("observer bug")

    class Notes(CallObserver):
        def run_started(self, payload: ToolTask, attempt: int, queued_secs: float | None) -> None:
            told.append(("started", attempt))

        def run_ended(self, payload: ToolTask, outcome: object, attempt: int, retry_in: float | None) -> None:
            told.append(("ended", retry_in is not None))

        def call_ended(self, payload: ToolTask, result: object) -> None:
            told.append(("call", getattr(result, "status", None)))

    r = runner(ledger)
    r.observers.add(Broken())
    r.observers.add(Notes())
    step = r.run(Delivery(task(), sent_at=time.time() - 1))
    assert isinstance(step, Answered) and step.result.status == "ok"
    assert told == [("started", 1), ("ended", False), ("call", "ok")]


def test_a_run_whose_filing_fails_with_a_store_error_stops_holding_its_claim() -> None:
    """A store error other than an outage (READONLY after a failover) ends the delivery; the claim
    is no longer renewed, so the call can be run again once its lease runs out."""
    from criogenai import StoreError

    class ReadOnlyOnce(MemoryLedger):
        failed = False

        def finish(self, *args: object, **kwargs: object) -> bool:
            if not self.failed:
                self.failed = True
                raise StoreError("READONLY You can't write against a read only replica.")
            return super().finish(*args, **kwargs)  # type: ignore[arg-type]

    ledger = ReadOnlyOnce(lease_secs=1)
    t = task()
    with pytest.raises(StoreError):
        runner(ledger).run(Delivery(t))
    claims: list[str] = []
    wait_for(lambda: claims.append(ledger.claim(t.run_id, "c1", "another-run", t.deadline).kind)
             or claims[-1] != "busy", timeout=5, what="the failed run's claim to lapse")
    assert claims[-1] == "claimed"


def test_an_interrupt_landing_in_an_observer_ends_the_run_and_lets_its_claim_go() -> None:
    """Celery's soft limit can land anywhere, an observer included: it is the call's interrupt,
    not the observer's failure, so it is not swallowed, and the claim is no longer renewed."""

    class SoftLimit(Exception):
        pass

    class Slow(CallObserver):
        def run_started(self, payload: ToolTask, attempt: int, queued_secs: float | None) -> None:
            raise SoftLimit()

    ledger = MemoryLedger(lease_secs=1)
    r = CallRunner(ToolRegistry([echo]), ledger, host="test", interrupts=(SoftLimit,))
    r.observers.add(Slow())
    t = task()
    with pytest.raises(SoftLimit):
        r.run(Delivery(t))
    claims: list[str] = []
    wait_for(lambda: claims.append(ledger.claim(t.run_id, "c1", "another-run", t.deadline).kind)
             or claims[-1] != "busy", timeout=5, what="the interrupted run's claim to lapse")
    assert claims[-1] == "claimed"
