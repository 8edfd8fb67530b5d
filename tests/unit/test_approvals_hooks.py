"""Approvals and hooks without a fleet: the decision rules on the in-memory store, the hook runners,
and one embedded turn (no broker) that pauses, is approved in process, and resumes."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from criogenai import (
    Answer,
    ApprovalConflict,
    ApprovalNotFound,
    Approvals,
    Block,
    ConfigurationError,
    Dispatcher,
    HookCall,
    InvalidApprovalArguments,
    ResultCache,
    Settings,
    ToolCall,
    ToolResult,
    tool,
)
from criogenai.dispatcher import _hooks
from criogenai.dispatcher._approvals import request_approval
from criogenai.store import MemoryApprovalStore


@tool(read_only=True)
def lookup(code: str) -> dict[str, str]:
    """Look a code up."""
    return {"code": code}


@tool(destructive=True)
def refund(order: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order}"


def fresh() -> tuple[Approvals, str]:
    store = MemoryApprovalStore()
    run_id = uuid.uuid4().hex
    call = ToolCall(id="c1", name="refund", arguments={"order": "A-1", "amount": 10})
    request_approval(store, run_id, call, refund.definition)
    return Approvals(Settings(), store=store), run_id


def test_asking_twice_keeps_the_first_request() -> None:
    approvals, run_id = fresh()
    again = ToolCall(id="c1", name="refund", arguments={"order": "B-2", "amount": 1})
    standing = request_approval(approvals.store, run_id, again, refund.definition)
    assert standing.call.arguments == {"order": "A-1", "amount": 10}


def test_an_edit_equal_to_the_request_is_an_approval_as_asked() -> None:
    approvals, run_id = fresh()
    record = approvals.approve(run_id, "c1", {"order": "A-1", "amount": 10})
    assert record.decision == "approved" and record.arguments is None


def test_invalid_edits_list_every_problem_and_record_nothing() -> None:
    approvals, run_id = fresh()
    with pytest.raises(InvalidApprovalArguments) as caught:
        approvals.approve(run_id, "c1", {"order": 7, "amount": "lots", "note": "x"})
    problems = caught.value.problems
    assert "order: 7 is not of type 'string'" in problems
    assert "amount: 'lots' is not of type 'number'" in problems
    assert any("'note' was unexpected" in p for p in problems)
    assert approvals.get(run_id, "c1").decision == "pending"


def test_repeating_a_decision_is_accepted_and_a_different_one_is_refused() -> None:
    approvals, run_id = fresh()
    first = approvals.reject(run_id, "c1", "too much", by="ann")
    assert approvals.reject(run_id, "c1", "too much", by="bo") == first
    with pytest.raises(ApprovalConflict, match="already rejected by ann"):
        approvals.reject(run_id, "c1", "another reason")
    with pytest.raises(ApprovalConflict):
        approvals.approve(run_id, "c1")
    assert approvals.get(run_id, "c1") == first


def test_unknown_calls_and_empty_reasons_are_refused() -> None:
    approvals, run_id = fresh()
    with pytest.raises(ApprovalNotFound):
        approvals.approve(run_id, "nope")
    with pytest.raises(ValueError, match="reason"):
        approvals.reject(run_id, "c1", "  ")
    assert [r.call_id for r in approvals.pending()] == ["c1"]
    approvals.approve(run_id, "c1")
    assert approvals.pending() == [] and len(approvals.records(decided=True)) == 1


# -- hook runners ------------------------------------------------------------------------------------


def run_before(*hooks: Any, arguments: dict[str, Any] | None = None) -> ToolCall | ToolResult:
    call = ToolCall(id="c", name="lookup", arguments=arguments or {"code": "X"})
    return asyncio.run(_hooks.run_before(list(hooks), call, lookup, "run"))


def test_a_hook_returning_something_unexpected_blocks_the_call_and_names_the_type() -> None:
    def sloppy(call: HookCall) -> Any:
        return {"code": "Y"}

    out = run_before(sloppy)
    assert isinstance(out, ToolResult) and out.status == "blocked"
    assert "sloppy" in out.content and "TypeError" in out.content


def test_a_slow_async_hook_is_stopped_at_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_hooks, "HOOK_TIMEOUT_SECS", 0.05)

    async def stuck(call: HookCall) -> None:
        await asyncio.sleep(30)

    out = run_before(stuck)
    assert isinstance(out, ToolResult) and out.status == "blocked" and "TimeoutError" in out.content


def test_an_answer_ends_the_hooks_and_is_a_cached_ok_result() -> None:
    later: list[str] = []
    out = run_before(lambda c: Answer({"code": "from memory"}), lambda c: later.append(c.call_id))
    assert isinstance(out, ToolResult)
    assert (out.status, out.cached, out.content) == ("ok", True, '{"code": "from memory"}')
    assert later == []


def test_hooks_get_a_copy_of_the_arguments() -> None:
    def meddle(call: HookCall) -> None:
        call.arguments["code"] = "changed behind our back"

    out = run_before(meddle)
    assert isinstance(out, ToolCall) and out.arguments == {"code": "X"}


def test_an_after_hook_must_return_a_result_of_the_same_call() -> None:
    original = ToolResult(call_id="c", name="lookup", status="ok", content="fine", attempts=1)

    def swap(call: HookCall, result: ToolResult) -> ToolResult:
        return result.model_copy(update={"call_id": "other"})

    seen = HookCall("lookup", {"code": "X"}, "run", "c", lookup)
    out = asyncio.run(_hooks.run_after([swap], seen, original))
    assert out.status == "blocked" and out.artifact is not None
    assert out.artifact["withheld"]["content"] == "fine"


def test_hook_answers_and_replacements_are_cut_like_tool_results() -> None:
    huge = "x" * 150_000
    answered = run_before(lambda c: Answer(huge))
    assert isinstance(answered, ToolResult) and answered.truncated
    assert len(answered.content) <= 100_000

    original = ToolResult(call_id="c", name="lookup", status="ok", content="fine", attempts=1)
    seen = HookCall("lookup", {"code": "X"}, "run", "c", lookup)
    replaced = asyncio.run(_hooks.run_after(
        [lambda call, r: r.model_copy(update={"content": huge})], seen, original))
    assert replaced.truncated and len(replaced.content) <= 100_000


# -- embedded (no broker): the in-memory equivalent ------------------------------------------------


@pytest.fixture(autouse=True)
def _no_fleet_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CRIOGENAI_BROKER_URL", "CRIOGENAI_RESULT_BACKEND", "CRIOGENAI_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)


def test_an_embedded_turn_pauses_and_resumes_after_an_approval_in_process() -> None:
    cache = ResultCache(ttl_secs=30)
    calls = [
        ToolCall(id="look", name="lookup", arguments={"code": "Z"}),
        ToolCall(id="pay", name="refund", arguments={"order": "A-1", "amount": 900}),
        ToolCall(id="big", name="refund", arguments={"order": "A-2", "amount": 5000}),
    ]

    def limit(call: HookCall) -> Block | None:
        return Block("refunds over 1000 need a manager") if call.arguments.get("amount", 0) > 1000 else None

    with Dispatcher(
        [lookup, refund], settings=Settings(), approve=["refund"], before_tool=[limit, cache.before],
        after_tool=[cache.after],
    ) as d:
        first = d.run_turn_sync(calls)
        assert [r.status for r in first] == ["ok", "pending_approval", "blocked"]
        run_id = first[0].run_id
        assert [p.call_id for p in Approvals(Settings()).pending(run_id)] == ["pay"]
        d.approvals.approve(run_id, "pay", {"order": "A-1", "amount": 90}, by="manager")
        again = d.run_turn_sync(calls, run_id=run_id)
        assert [r.status for r in again] == ["ok", "ok", "blocked"]
        assert again[1].content == "refunded 90.0 on A-1"
        [hit] = d.run_turn_sync([ToolCall(id="look2", name="lookup", arguments={"code": "Z"})])
        assert hit.cached and hit.content == first[0].content


def test_approve_takes_tool_names_the_dispatcher_has() -> None:
    with pytest.raises(ConfigurationError, match="nope"):
        Dispatcher([lookup], settings=Settings(), approve=["nope"])
