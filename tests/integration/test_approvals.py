"""Human approval and tool hooks on a real fleet (a `criogenai worker` subprocess, prefork then threads).

Decisions are made from a second process (``python -m criogenai approvals ...``), and turns are
resumed from a new Dispatcher after the first one is closed. Real runs are counted in Redis
(tests/fleet_tools.py): a call that "did not run" has a count of 0.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import redis

from criogenai import (
    Allow,
    ApprovalConflict,
    Approvals,
    Block,
    ChangeArguments,
    Dispatcher,
    HookCall,
    ResultCache,
    Settings,
    ToolCall,
    ToolResult,
)
from criogenai.store import RedisApprovalStore
from tests import fleet_tools
from tests.conftest import PYTHONPATH, ROOT, WorkerProcess, fleet_url, key, make_dispatcher


def approvals() -> Approvals:
    return Approvals(Settings(broker_url=fleet_url()))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``criogenai approvals ...`` in a process of its own, as the person on call runs it."""
    env = {**os.environ, "CRIOGENAI_BROKER_URL": fleet_url(), "PYTHONPATH": PYTHONPATH}
    return subprocess.run(
        [sys.executable, "-m", "criogenai", "approvals", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )


def by_id(results: list[ToolResult]) -> dict[str, ToolResult]:
    return {r.call_id: r for r in results}


def settle() -> None:
    """Long enough for a call sent by mistake to have run on the idle fleet."""
    time.sleep(0.5)


def turn_of(k_approve: str, k_plain: str) -> list[ToolCall]:
    return [
        ToolCall(id="plain", name="sleep_for", arguments={"seconds": 0.01, "key": k_plain}),
        ToolCall(id="echo", name="echo", arguments={"text": "hello"}),
        ToolCall(id="needs_ok", name="count", arguments={"key": k_approve}),
    ]


def first_turn(calls: list[ToolCall]) -> str:
    """Run a turn with ``count`` approve-listed in a dispatcher that is then closed; its run id."""
    with make_dispatcher(approve=["count"]) as d:
        results = d.run_turn_sync(calls)
    assert results[-1].status == "pending_approval", results
    return results[-1].run_id


def resume(calls: list[ToolCall], run_id: str) -> dict[str, ToolResult]:
    with make_dispatcher(approve=["count"]) as d:
        return by_id(d.run_turn_sync(calls, run_id=run_id))


# -- approval --------------------------------------------------------------------------------------


def test_an_approve_listed_call_waits_while_the_other_calls_of_its_turn_finish(fleet: WorkerProcess) -> None:
    k, k2 = key(), key()
    with make_dispatcher(approve=["count"]) as d:
        results = by_id(d.run_turn_sync(turn_of(k, k2)))
    assert results["plain"].status == "ok" and results["echo"].content == "hello"
    waiting = results["needs_ok"]
    assert waiting.status == "pending_approval" and waiting.attempts == 0
    assert "waits for a person" in waiting.content
    assert waiting.artifact is not None
    assert waiting.artifact["approval"] == {"run_id": waiting.run_id, "call_id": "needs_ok",
                                            "arguments": {"key": k}}
    settle()
    assert fleet_tools.runs(k) == 0 and fleet_tools.runs(k2) == 1
    [pending] = approvals().pending(waiting.run_id)
    assert (pending.call_id, pending.tool_name, pending.call.arguments) == ("needs_ok", "count", {"key": k})
    assert pending.decision == "pending"
    ttl = redis.Redis.from_url(fleet_url()).ttl(f"crg:{{{waiting.run_id}}}:approvals")
    assert 0 < ttl <= Settings().retention_secs


def test_a_call_approved_in_another_process_runs_when_a_new_dispatcher_resumes_the_turn(
    fleet: WorkerProcess,
) -> None:
    k, k2 = key(), key()
    calls = turn_of(k, k2)
    run_id = first_turn(calls)

    listed = cli("list", "--run", run_id, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(r["call"]["id"], r["decision"]) for r in json.loads(listed.stdout)] == [("needs_ok", "pending")]
    assert run_id in cli("list").stdout
    done = cli("approve", run_id, "needs_ok", "--by", "alice")
    assert done.returncode == 0, done.stderr
    assert run_id not in cli("list").stdout

    results = resume(calls, run_id)
    assert results["needs_ok"].status == "ok" and json.loads(results["needs_ok"].content)["n"] == 1
    assert fleet_tools.runs(k) == 1
    assert fleet_tools.runs(k2) == 1, "a finished call ran again on resume"
    again = resume(calls, run_id)
    assert again["needs_ok"].content == results["needs_ok"].content
    assert fleet_tools.runs(k) == 1
    assert approvals().get(run_id, "needs_ok").by == "alice"


def test_a_person_may_approve_with_edited_arguments_and_the_call_runs_with_them(fleet: WorkerProcess) -> None:
    k, k_edit = key(), key()
    calls = turn_of(k, key())
    run_id = first_turn(calls)
    done = cli("approve", run_id, "needs_ok", "--arguments", json.dumps({"key": k_edit}), "--by", "carol")
    assert done.returncode == 0, done.stderr
    assert "edited" in done.stdout

    results = resume(calls, run_id)
    assert results["needs_ok"].status == "ok"
    assert (fleet_tools.runs(k), fleet_tools.runs(k_edit)) == (0, 1)
    record = approvals().get(run_id, "needs_ok")
    assert record.arguments == {"key": k_edit} and record.call.arguments == {"key": k}


def test_invalid_edited_arguments_are_refused_with_their_problems_and_nothing_changes(
    fleet: WorkerProcess,
) -> None:
    k = key()
    calls = turn_of(k, key())
    run_id = first_turn(calls)
    refused = cli("approve", run_id, "needs_ok", "--arguments", json.dumps({"key": 5, "colour": "red"}))
    assert refused.returncode == 1
    assert "key: 5 is not of type 'string'" in refused.stderr
    assert "'colour' was unexpected" in refused.stderr
    assert "nothing changed" in refused.stderr

    assert approvals().get(run_id, "needs_ok").decision == "pending"
    results = resume(calls, run_id)
    assert results["needs_ok"].status == "pending_approval", "an undecided call keeps waiting"
    settle()
    assert fleet_tools.runs(k) == 0


def test_a_rejected_call_gives_the_model_the_reason_and_never_runs(fleet: WorkerProcess) -> None:
    k = key()
    calls = turn_of(k, key())
    run_id = first_turn(calls)
    done = cli("reject", run_id, "needs_ok", "--reason", "not on a Sunday", "--by", "bob")
    assert done.returncode == 0, done.stderr

    rejected = resume(calls, run_id)["needs_ok"]
    assert rejected.status == "rejected" and rejected.attempts == 0
    assert "not on a Sunday" in rejected.content
    assert rejected.artifact is not None and rejected.artifact["approval"]["by"] == "bob"
    settle()
    assert fleet_tools.runs(k) == 0


def test_a_second_conflicting_decision_is_refused_and_the_first_stands(fleet: WorkerProcess) -> None:
    calls = turn_of(key(), key())
    run_id = first_turn(calls)
    first = approvals().approve(run_id, "needs_ok", by="alice")

    refused = cli("reject", run_id, "needs_ok", "--reason", "changed my mind", "--by", "bob")
    assert refused.returncode == 1 and "already approved by alice" in refused.stderr
    with pytest.raises(ApprovalConflict) as caught:
        approvals().approve(run_id, "needs_ok", {"key": "other"}, by="bob")
    assert caught.value.approval.decision == "approved"
    # The same decision again is accepted and changes nothing (a retried request is harmless).
    assert approvals().approve(run_id, "needs_ok", by="dave") == first
    assert cli("approve", run_id, "needs_ok").returncode == 0
    assert approvals().get(run_id, "needs_ok") == first


class RacingStore(RedisApprovalStore):
    """Holds each decider after its first read until all have read: every one of them then tries
    to write over the same pending record, and the atomic swap must let exactly one through."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__(fleet_url())
        self.barrier, self.first = barrier, True

    def get(self, run_id: str, call_ids: list[str]) -> dict[str, str]:
        found = super().get(run_id, call_ids)
        if self.first:
            self.first = False
            self.barrier.wait(20)
        return found


def test_concurrent_decisions_on_one_call_have_exactly_one_winner(fleet: WorkerProcess) -> None:
    run_id = first_turn(turn_of(key(), key()))
    barrier = threading.Barrier(8)

    def decide(i: int) -> str:
        a = Approvals(Settings(broker_url=fleet_url()), store=RacingStore(barrier))
        try:
            if i % 2:
                a.approve(run_id, "needs_ok", by=f"p{i}")
            else:
                a.reject(run_id, "needs_ok", reason="no", by=f"p{i}")
        except ApprovalConflict:
            return "conflict"
        return "approved" if i % 2 else "rejected"

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        outcomes = list(ex.map(decide, range(8)))
    stored = approvals().get(run_id, "needs_ok")
    assert stored.decision in ("approved", "rejected")
    assert sorted(outcomes) == sorted([stored.decision] * 4 + ["conflict"] * 4), outcomes
    assert stored.by in {f"p{i}" for i in range(8)}


# -- before_tool hooks -----------------------------------------------------------------------------


def test_before_tool_hooks_run_in_order_and_pass_change_or_block_calls(fleet: WorkerProcess) -> None:
    k_pass, k_real, k_blocked = key(), key(), key()
    seen: list[tuple[str, str, Any]] = []

    def rename(call: HookCall) -> ChangeArguments | None:
        seen.append(("rename", call.call_id, call.arguments))
        if call.arguments.get("key") == "placeholder":
            return ChangeArguments({"key": k_real})
        return None

    async def guard(call: HookCall) -> Block | Allow:
        await asyncio.sleep(0)
        seen.append(("guard", call.call_id, call.arguments))
        if call.arguments.get("key") == k_blocked:
            return Block("Counting this key is not allowed after 18:00.")
        return Allow()

    with make_dispatcher(before_tool=[rename, guard]) as d:
        results = by_id(asyncio.run(d.run_turn([
            ToolCall(id="pass", name="count", arguments={"key": k_pass}),
            ToolCall(id="change", name="count", arguments={"key": "placeholder"}),
            ToolCall(id="block", name="count", arguments={"key": k_blocked}),
            ToolCall(id="bad_change", name="count", arguments={"key": "placeholder", "extra": 1}),
        ])))
    assert results["pass"].status == "ok" and results["change"].status == "ok"
    assert (fleet_tools.runs(k_pass), fleet_tools.runs(k_real), fleet_tools.runs("placeholder")) == (1, 1, 0)
    assert results["block"].status == "blocked"
    assert results["block"].content == "Counting this key is not allowed after 18:00."
    assert results["bad_change"].status == "invalid_arguments"  # refused by check_turn, no hook saw it
    settle()
    assert fleet_tools.runs(k_blocked) == 0
    assert ("guard", "change", {"key": k_real}) in seen, "the second hook sees the first one's change"
    assert [s[0] for s in seen if s[1] == "pass"] == ["rename", "guard"]


def test_arguments_changed_by_a_hook_are_validated_again(fleet: WorkerProcess) -> None:
    with make_dispatcher(before_tool=[lambda call: ChangeArguments({"key": 42})]) as d:
        [r] = d.run_turn_sync([ToolCall(id="c", name="count", arguments={"key": key()})])
    assert r.status == "invalid_arguments" and r.attempts == 0
    assert "key: 42 is not of type 'string'" in r.content and "before_tool hook" in r.content


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_hook_that_raises_blocks_only_its_call_and_says_which_hook_failed(
    fleet: WorkerProcess, kind: str
) -> None:
    k_ok, k_bad = key(), key()

    def sync_fails(call: HookCall) -> None:
        if call.arguments["key"] == k_bad:
            raise LookupError("the rules service is down")

    async def async_fails(call: HookCall) -> None:
        sync_fails(call)

    hook = sync_fails if kind == "sync" else async_fails
    with make_dispatcher(before_tool=[hook]) as d:
        results = by_id(d.run_turn_sync([
            ToolCall(id="ok", name="count", arguments={"key": k_ok}),
            ToolCall(id="bad", name="count", arguments={"key": k_bad}),
        ]))
    assert results["ok"].status == "ok"
    bad = results["bad"]
    assert bad.status == "blocked"
    assert hook.__name__ in bad.content and "LookupError" in bad.content
    assert bad.artifact is not None and bad.artifact["hook_error"]["message"] == "the rules service is down"
    settle()
    assert (fleet_tools.runs(k_ok), fleet_tools.runs(k_bad)) == (1, 0)


def test_hooks_run_before_approval_and_a_blocked_call_is_never_put_to_a_person(fleet: WorkerProcess) -> None:
    def no_big_counts(call: HookCall) -> Block | None:
        return Block("too big") if call.arguments["key"].startswith("big") else None

    with make_dispatcher(approve=["count"], before_tool=[no_big_counts]) as d:
        results = by_id(d.run_turn_sync([
            ToolCall(id="big", name="count", arguments={"key": "big" + key()}),
            ToolCall(id="small", name="count", arguments={"key": key()}),
        ]))
    assert (results["big"].status, results["small"].status) == ("blocked", "pending_approval")
    assert [p.call_id for p in approvals().pending(results["big"].run_id)] == ["small"]


def test_on_resume_hooks_see_neither_finished_calls_nor_decided_ones(fleet: WorkerProcess) -> None:
    seen: list[str] = []

    def note(call: HookCall) -> None:
        seen.append(call.call_id)

    calls = turn_of(key(), key())
    with make_dispatcher(approve=["count"], before_tool=[note]) as d:
        first = by_id(d.run_turn_sync(calls))
        run_id = first["needs_ok"].run_id
        assert sorted(seen) == ["echo", "needs_ok", "plain"]
        approvals().approve(run_id, "needs_ok")
        seen.clear()
        again = by_id(d.run_turn_sync(calls, run_id=run_id))
    assert seen == []
    assert again["plain"] == first["plain"] and again["needs_ok"].status == "ok"


# -- the result cache ------------------------------------------------------------------------------


def test_a_cache_hit_answers_a_read_only_call_without_running_the_tool(fleet: WorkerProcess) -> None:
    k = key()
    cache = ResultCache(ttl_secs=60)
    read = {"key": k, "fail_times": 0}
    with make_dispatcher(before_tool=[cache.before], after_tool=[cache.after]) as d:
        [first] = d.run_turn_sync([ToolCall(id="r1", name="flaky_read", arguments=read)])
        # Another run, keys in another order: the same canonical arguments.
        [hit] = d.run_turn_sync([ToolCall(id="r2", name="flaky_read", arguments={"fail_times": 0, "key": k})])
        other = {"key": k, "fail_times": 1}
        [miss] = d.run_turn_sync([ToolCall(id="r3", name="flaky_read", arguments=other)])
    assert (first.status, first.cached, first.content) == ("ok", False, "ok after 1")
    assert (hit.status, hit.cached, hit.content, hit.attempts) == ("ok", True, "ok after 1", 0)
    assert hit.call_id == "r2" and hit.run_id != first.run_id
    assert miss.cached is False and miss.content == "ok after 2"
    assert fleet_tools.runs(k) == 2, "the cache hit ran the tool"
    client = redis.Redis.from_url(fleet_url())
    entries = list(client.scan_iter("crg:cache:flaky_read:*"))
    assert len(entries) == 2 and all(0 < client.ttl(e) <= 60 for e in entries)


def test_the_cache_never_answers_tools_that_are_not_read_only(fleet: WorkerProcess) -> None:
    k = key()
    cache = ResultCache(ttl_secs=60)
    with make_dispatcher(before_tool=[cache.before], after_tool=[cache.after]) as d:
        for i in range(2):
            [r] = d.run_turn_sync([ToolCall(id=f"c{i}", name="count", arguments={"key": k})])
            assert r.status == "ok" and not r.cached
    assert fleet_tools.runs(k) == 2


# -- after_tool hooks ------------------------------------------------------------------------------


def test_an_after_hook_redaction_is_what_the_model_sees(fleet: WorkerProcess) -> None:
    audit: list[tuple[str, str]] = []

    def redact(call: HookCall, result: ToolResult) -> ToolResult:
        return result.model_copy(update={"content": result.content.replace("4111-1111", "[card]")})

    async def record(call: HookCall, result: ToolResult) -> None:
        audit.append((call.call_id, result.content))

    with make_dispatcher(after_tool=[redact, record]) as d:
        results = by_id(asyncio.run(d.run_turn([
            ToolCall(id="card", name="echo", arguments={"text": "paid with 4111-1111"}),
            ToolCall(id="nope", name="no_such_tool", arguments={}),
        ])))
    assert results["card"].content == "paid with [card]"
    assert results["nope"].status == "unknown_tool"
    assert audit == [("card", "paid with [card]"), ("nope", results["nope"].content)]


def test_an_after_hook_that_raises_withholds_the_result_from_the_model_but_keeps_it(
    fleet: WorkerProcess,
) -> None:
    def broken_redactor(call: HookCall, result: ToolResult) -> ToolResult:
        raise ValueError("regex failed")

    with make_dispatcher(after_tool=[broken_redactor]) as d:
        [r] = d.run_turn_sync([ToolCall(id="s", name="echo", arguments={"text": "secret 42"})])
    assert r.status == "blocked" and r.attempts == 1
    assert "secret" not in r.content
    assert "broken_redactor" in r.content and "ValueError" in r.content
    assert r.artifact is not None and r.artifact["withheld"]["content"] == "secret 42"


def test_a_dispatcher_refuses_to_approve_tools_it_does_not_have() -> None:
    from criogenai import ConfigurationError

    with pytest.raises(ConfigurationError, match="launch_rocket"):
        make_dispatcher(approve=["launch_rocket"])


def test_dispatchers_without_hooks_run_as_before(fleet: WorkerProcess) -> None:
    d: Dispatcher = make_dispatcher()  # type: ignore[assignment]
    with d:
        [r] = d.run_turn_sync([ToolCall(id="e", name="echo", arguments={"text": "plain"})])
    assert (r.status, r.content, r.cached) == ("ok", "plain", False)
