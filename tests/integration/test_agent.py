"""The agent loop on a real fleet: a `criogenai worker` subprocess (prefork) on the real Redis.

The model is a FakeModel (or a local chat-completions server), so every test asserts the exact
text the model was sent. Tools count their real runs in Redis (tests/fleet_tools.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from criogenai import Agent, Dispatcher, FakeModel, Settings, ToolFailed
from criogenai.agent._runs import make_records
from criogenai.runner._outcomes import GENERIC_FAILURE
from criogenai.tools import Tool
from tests import agent_tools, fleet_tools
from tests.chat_server import anthropic_message, chat_server, completion, function_call, tool_use
from tests.conftest import ROOT, WorkerProcess, fleet_url, key, start_worker
from tests.sdk_types import check_anthropic_reply, check_anthropic_request, check_openai_request

FLEET_TOOLS = [v for v in vars(fleet_tools).values() if isinstance(v, Tool)]
ALL_TOOLS = [*FLEET_TOOLS, agent_tools.fail_once, agent_tools.research]


def settings() -> Settings:
    return Settings(broker_url=fleet_url(), lease_secs=2.0)


@pytest.fixture(scope="module")
def agent_fleet(tmp_path_factory: pytest.TempPathFactory, redis_up: None) -> Iterator[WorkerProcess]:
    """One prefork worker serving the fleet tools and the agent tests' own (an agent among them)."""
    redis.Redis.from_url(fleet_url()).flushdb()
    w = start_worker(fleet_url(), tmp_path_factory.mktemp("agent-fleet"), pool="prefork", concurrency=6,
                     queues="criogenai", tools="tests.fleet_tools,tests.agent_tools")
    yield w
    w.stop()


@pytest.fixture
def agents(agent_fleet: WorkerProcess) -> Iterator[list[Agent]]:
    made: list[Agent] = []
    yield made
    for a in made:
        a.close()


def make_agent(made: list[Agent], model: Any, tools: list[Tool[..., Any]] = ALL_TOOLS, **kw: Any) -> Agent:
    a = Agent(model, tools=tools, settings=settings(), **kw)
    made.append(a)
    return a



def call(cid: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": cid, "name": name, "arguments": arguments}


def test_a_run_of_several_rounds_of_parallel_calls_on_the_fleet(agents: list[Agent]) -> None:
    k1, k2, k3 = key(), key(), key()
    fake = FakeModel([
        [call("a", "count", key=k1), call("b", "count", key=k2), call("c", "echo", text="first")],
        [call("d", "count", key=k1), call("e", "echo", text="second")],
        [call("f", "sleep_for", seconds=1.0, key=k3), call("g", "sleep_for", seconds=1.0, key=k3)],
        "All counted.",
    ])
    started = time.monotonic()
    result = make_agent(agents, fake).run_sync("count things")
    elapsed = time.monotonic() - started
    assert result.status == "completed" and result.output == "All counted."
    seen = [r.tool_results for r in fake.requests]
    assert [sorted(s) for s in seen] == [[], ["a", "b", "c"], ["d", "e"], ["f", "g"]]
    assert [json.loads(seen[1][c])["n"] for c in "ab"] == [1, 1] and seen[1]["c"] == "first"
    assert json.loads(seen[2]["d"])["n"] == 2 and seen[2]["e"] == "second"
    assert fleet_tools.runs(k1) == 2 and fleet_tools.runs(k2) == 1 and fleet_tools.runs(k3) == 2
    assert elapsed < 1.9 + 5, f"two 1 s calls of one turn took {elapsed:.1f} s: not concurrent"
    # The run is stored in Redis as it went: every message, every full result.
    stored = make_records(Settings(broker_url=fleet_url())).entries(result.run_id)
    assert [e.message for e in stored] == result.messages
    assert [e.result for e in stored if e.result] == result.tool_results
    assert {r.run_id for r in result.tool_results} == {result.run_id}


def test_the_model_is_sent_exactly_the_specs_outcome_texts(agents: list[Agent]) -> None:
    calls = [
        call("err", "flaky_write", key=key(), fail_times=9),
        call("bad", "echo", text=5, extra=1),
        call("nope", "launch_rocket"),
        call("slow", "sleep_for", seconds=4.0),
        call("exc", "boom", secret="hunter2"),
    ]
    fake = FakeModel([calls, "noted"])
    policy: dict[str, Any] = {"on_tool_exception": "return_generic", "limits": {"tool_timeout_secs": 1}}
    result = make_agent(agents, fake, **policy).run_sync("try everything")
    seen = fake.requests[1].tool_results
    available = ", ".join(sorted(t.name for t in ALL_TOOLS))
    assert seen == {
        "err": "not yet (1)",
        "bad": "Invalid arguments for tool 'echo':\n"
               "- arguments: Additional properties are not allowed ('extra' was unexpected)\n"
               "- text: 5 is not of type 'string'",
        "nope": f"Unknown tool 'launch_rocket'. Available tools: {available}.",
        "slow": seen["slow"],
        "exc": GENERIC_FAILURE,
    }
    assert seen["slow"].startswith("Tool 'sleep_for' did not finish within 1 s")
    assert [r.status for r in result.tool_results] == [
        "tool_error", "invalid_arguments", "unknown_tool", "timeout", "exception"]
    # What the model read is what the dispatcher makes of the same calls, word for word.
    with Dispatcher(ALL_TOOLS, settings=settings(), **policy) as d:
        direct = d.run_turn_sync([{**c, "arguments": {**c["arguments"], "key": key()}}
                                  if c["name"] == "flaky_write" else c for c in calls])
    assert [r.content for r in direct] == [seen[c["id"]] for c in calls]
    # return_generic: the secret in the exception never reached the model; the records keep the artifact.
    told = [m.model_dump() for r in fake.requests for m in r.messages if m.role == "tool"]
    assert len(told) == 5 and "hunter2" not in json.dumps(told)
    assert result.tool_results[4].artifact == direct[4].artifact
    assert result.tool_results[4].artifact["exception"]["type"] == "RuntimeError"  # type: ignore[index]


def test_fail_ends_the_run_and_retry_finishes_it_without_rerunning_finished_tools(
    agents: list[Agent],
) -> None:
    k1, k2, k3 = key(), key(), key()
    script = [
        [call("c1", "count", key=k1), call("c2", "count", key=k2), call("c3", "fail_once", key=k3)],
        "finished",
    ]
    first = make_agent(agents, FakeModel(script), on_tool_exception="fail")
    with pytest.raises(ToolFailed) as info:
        first.run_sync("do it", run_id=f"run-{k1}")
    assert info.value.code == "tool_failed" and info.value.result.run_id == f"run-{k1}"
    assert "RuntimeError" in str(info.value.__cause__)
    failed = first.get_run(f"run-{k1}")
    assert failed.status == "failed" and failed.error is not None
    assert (failed.error.code, failed.error.call_id) == ("tool_failed", "c3")
    assert [fleet_tools.runs(k) for k in (k1, k2, k3)] == [1, 1, 1]

    # A new agent (another process, say) continues the run from its records.
    fake = FakeModel(script)
    done = make_agent(agents, fake, on_tool_exception="fail").retry_sync(f"run-{k1}")
    assert done.status == "completed" and done.output == "finished"
    assert [fleet_tools.runs(k) for k in (k1, k2, k3)] == [1, 1, 2]
    seen = fake.requests[0].tool_results
    assert [json.loads(seen[c])["n"] for c in ("c1", "c2")] == [1, 1] and seen["c3"] == "ok on run 2"
    assert len(fake.requests) == 1  # the model was asked only the round it had not answered


def test_a_run_whose_agent_process_died_mid_turn_is_retried_without_rerunning_tools(
    agents: list[Agent], tmp_path: Path
) -> None:
    k1, k2, run_id = key(), key(), f"crash-{key()}"
    script = [[call("fast", "count", key=k1), call("slow", "sleep_for", seconds=2.5, key=k2)], "survived"]
    code = textwrap.dedent(f"""
        from criogenai import Agent, FakeModel, Settings
        from tests.conftest import fleet_url
        from tests.integration.test_agent import ALL_TOOLS
        agent = Agent(FakeModel({script!r}), tools=ALL_TOOLS,
                      settings=Settings(broker_url=fleet_url(), lease_secs=2.0))
        agent.run_sync("go", run_id={run_id!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    deadline = time.monotonic() + 30
    while not (fleet_tools.runs(k1) == 1 and fleet_tools.runs(k2) == 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert fleet_tools.runs(k1) == 1 and fleet_tools.runs(k2) == 1, "the turn never started"

    fake = FakeModel(script)
    done = make_agent(agents, fake).retry_sync(run_id)
    assert done.status == "completed" and done.output == "survived"
    assert [fleet_tools.runs(k) for k in (k1, k2)] == [1, 1]
    assert json.loads(fake.requests[0].tool_results["fast"])["n"] == 1
    assert json.loads(fake.requests[0].tool_results["slow"])["slept"] == 2.5


def test_an_agent_runs_as_a_tool_of_another_on_the_fleet(agents: list[Agent]) -> None:
    fake = FakeModel([[call("q1", "research", prompt="flu"), call("q2", "research", prompt="measles")],
                      "Both researched."])
    result = make_agent(agents, fake).run_sync("research two things", run_id=f"outer-{key()}")
    assert result.output == "Both researched."
    assert fake.requests[1].tool_results == {"q1": "summary: found flu", "q2": "summary: found measles"}
    # The inner runs are stored under the outer run and call, like any run.
    inner = make_records(Settings(broker_url=fleet_url())).entries(f"{result.run_id}.q1")
    assert [(e.message.role, getattr(e.message, "content", None)) for e in inner] == [
        ("user", "flu"), ("assistant", None), ("tool", "found flu"), ("assistant", "summary: found flu")]


def test_the_openai_adapter_drives_the_fleet_in_the_chat_completions_wire_format(
    agents: list[Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    k = key()

    def second(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, completion("The count is in.")

    with chat_server([
        (503, {"error": {"message": "overloaded"}}),
        (200, completion(tool_calls=[
            function_call("call_1", "count", json.dumps({"key": k})),
            function_call("call_2", "echo", '{"text": "unterminated'),
            function_call("call_3", "echo", json.dumps({"text": "hello"})),
        ])),
        second,
    ]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
        a = make_agent(agents, "openai:local-model", tools=FLEET_TOOLS, instructions="Be brief.")
        result = a.run_sync("Count once.")
    assert result.status == "completed" and result.output == "The count is in."
    assert len(server.requests) == 3 and fleet_tools.runs(k) == 1
    first, last = server.requests[1], server.requests[2]
    assert first["model"] == "local-model"
    assert first["messages"] == [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Count once."}]
    echo = next(t for t in first["tools"] if t["function"]["name"] == "echo")
    assert echo == {"type": "function", "function": {
        "name": "echo", "description": "Return the text.", "parameters": fleet_tools.echo.schema,
        "strict": True}}
    def fn(call_id: str, name: str, arguments: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}

    assert last["messages"][2] == {"role": "assistant", "content": None, "tool_calls": [
        fn("call_1", "count", json.dumps({"key": k})),
        fn("call_2", "echo", '{"text": "unterminated'),
        fn("call_3", "echo", '{"text": "hello"}'),
    ]}
    tool_msgs = last["messages"][3:]
    assert [(m["role"], m["tool_call_id"]) for m in tool_msgs] == [
        ("tool", "call_1"), ("tool", "call_2"), ("tool", "call_3")]
    assert json.loads(tool_msgs[0]["content"])["n"] == 1
    assert tool_msgs[1]["content"].startswith(
        "Invalid arguments for tool 'echo':\n- arguments: not valid JSON (Unterminated string")
    assert tool_msgs[2] == {"role": "tool", "tool_call_id": "call_3", "content": "hello"}
    for body in server.requests:
        check_openai_request(body)


def test_the_anthropic_adapter_drives_the_fleet_in_the_messages_wire_format(
    agents: list[Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a Messages API server, overloaded once, whose model then uses three tools in parallel
    k = key()
    with chat_server([
        (529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
         {"retry-after": "0"}),
        (200, anthropic_message(tool_uses=[
            tool_use("toolu_1", "count", {"key": k}),
            tool_use("toolu_2", "flaky_write", {"key": key(), "fail_times": 1}),
            tool_use("toolu_3", "echo", {"text": "hello"}),
        ])),
        (200, anthropic_message("The count is in.")),
    ]) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.root_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-local")
        # When an agent runs on the fleet
        a = make_agent(agents, "anthropic:claude-local", tools=FLEET_TOOLS, instructions="Be brief.")
        result = a.run_sync("Count once.")
    # Then the worker ran the calls, and the model read their results as tool_result blocks
    assert result.status == "completed" and result.output == "The count is in."
    assert len(server.requests) == 3 and fleet_tools.runs(k) == 1
    for body in server.requests:
        check_anthropic_request(body)
    assert [check_anthropic_reply(r).model for r in server.sent] == ["claude-local"] * 2
    results = server.requests[2]["messages"][2]
    assert results["role"] == "user"
    assert [(b["type"], b["tool_use_id"], b["is_error"]) for b in results["content"]] == [
        ("tool_result", "toolu_1", False), ("tool_result", "toolu_2", True),
        ("tool_result", "toolu_3", False)]
    assert json.loads(results["content"][0]["content"])["n"] == 1
    assert results["content"][1]["content"] == "not yet (1)" and results["content"][2]["content"] == "hello"
    assert server.requests[2]["system"] == "Be brief."


def test_a_run_waits_for_approval_and_is_resumed_after_a_person_decides(agents: list[Agent]) -> None:
    from criogenai import Approvals

    k_send, k_refund, k_count = key(), key(), key()
    script = [
        [call("w1", "flaky_write", key=k_send, fail_times=0),
         call("w2", "flaky_write", key=k_refund, fail_times=0),
         call("c1", "count", key=k_count)],
        "Sent one, refused one.",
    ]
    first = make_agent(agents, FakeModel(script), approve=["flaky_write"])
    waiting = first.run_sync("send and refund", run_id=f"appr-{k_send}")
    assert waiting.status == "waiting_for_approval" and waiting.output == ""
    assert [(r.call_id, r.status) for r in waiting.pending] == [("w1", "pending_approval"),
                                                                ("w2", "pending_approval")]
    assert first.get_run(waiting.run_id).status == "waiting_for_approval"
    assert [fleet_tools.runs(k) for k in (k_send, k_refund, k_count)] == [0, 0, 1]

    approvals = Approvals(settings())
    assert {p.call_id for p in approvals.pending(waiting.run_id)} == {"w1", "w2"}
    approvals.approve(waiting.run_id, "w1", by="nurse")
    approvals.reject(waiting.run_id, "w2", "refunds need a manager", by="nurse")

    fake = FakeModel(script)
    done = make_agent(agents, fake, approve=["flaky_write"]).resume_sync(waiting.run_id)
    assert done.status == "completed" and done.output == "Sent one, refused one."
    assert [fleet_tools.runs(k) for k in (k_send, k_refund, k_count)] == [1, 0, 1]
    seen = fake.requests[0].tool_results
    assert seen["w1"] == "ok after 1" and json.loads(seen["c1"])["n"] == 1
    assert "refunds need a manager" in seen["w2"]
    assert [r.status for r in done.tool_results] == ["ok", "rejected", "ok"]
