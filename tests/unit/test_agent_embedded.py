"""The agent loop on the embedded engine (one process, no broker): FakeModel, records, retry, OpenAI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from examples.clinic import get_lab_result, schedule_visit, send

from criogenai import (
    Agent,
    ConfigurationError,
    FakeModel,
    ModelError,
    RunNotFound,
    Settings,
    ToolContext,
    ToolError,
    tool,
)
from criogenai.agent import AssistantMessage, ModelRequest, OpenAIModel, ToolMessage, UserMessage
from criogenai.runner._outcomes import GENERIC_FAILURE
from tests.chat_server import chat_server, completion, function_call

EMBEDDED = Settings()
CLINIC = [schedule_visit, get_lab_result, send]


@pytest.fixture(autouse=True)
def _no_fleet_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CRIOGENAI_BROKER_URL", "CRIOGENAI_RESULT_BACKEND", "CRIOGENAI_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    made: list[Agent] = []
    yield made
    for a in made:
        a.close()


def agent(made: list[Agent], model: Any, tools: Any = CLINIC, **kw: Any) -> Agent:
    a = Agent(model, tools=tools, settings=kw.pop("settings", EMBEDDED), **kw)
    made.append(a)
    return a


def call(cid: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": cid, "name": name, "arguments": arguments}


def test_a_scripted_run_gives_the_model_each_rounds_results_in_call_order(agents: list[Agent]) -> None:
    fake = FakeModel([
        [call("c1", "get_lab_result", test_id="LAB-1"), call("c2", "get_lab_result", test_id="7")],
        [call("c3", "send_message", text="LAB-1 is final")],
        "LAB-1 is final; the care team knows.",
    ])
    result = agent(agents, fake).run_sync("Check LAB-1 and tell the team.")
    assert result.status == "completed"
    assert result.output == "LAB-1 is final; the care team knows."
    assert [r.tool_results for r in fake.requests] == [
        {},
        {"c1": '{"test_id": "LAB-1", "status": "final"}', "c2": "Lab ids look like LAB-12345"},
        {"c3": "sent"},
    ]
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "tool", "assistant", "tool",
                                                 "assistant"]
    assert [r.status for r in result.tool_results] == ["ok", "tool_error", "ok"]
    assert [t.name for t in fake.requests[0].tools] == ["schedule_visit", "get_lab_result", "send_message"]
    assert fake.requests[0].tools[0].parameters == schedule_visit.schema


def test_unknown_tools_and_arguments_that_are_not_json_go_back_to_the_model(agents: list[Agent]) -> None:
    fake = FakeModel([
        [
            call("u", "launch_rocket"),
            {"id": "j", "name": "schedule_visit", "arguments": '{"patient_ref": "P-1", '},
            call("v", "schedule_visit", patient_ref="P-1", kind="spa", slots=[]),
        ],
        "ok",
    ])
    agent(agents, fake).run_sync("go")
    seen = fake.requests[1].tool_results
    assert seen["u"] == "Unknown tool 'launch_rocket'. Available tools: get_lab_result, schedule_visit, " \
                        "send_message."
    assert seen["j"].startswith("Invalid arguments for tool 'schedule_visit':\n- arguments: not valid JSON (")
    assert seen["v"].startswith("Invalid arguments for tool 'schedule_visit':\n- kind: 'spa' is not one of")


def test_a_run_stops_after_max_model_rounds(agents: list[Agent]) -> None:
    fake = FakeModel([[call(f"c{i}", "get_lab_result", test_id="LAB-1")] for i in range(10)])
    result = agent(agents, fake, limits={"max_model_rounds": 3}).run_sync("loop")
    assert result.status == "max_rounds" and result.output == ""
    assert len(fake.requests) == 3
    assert [m.role for m in result.messages].count("tool") == 3


def test_call_ids_a_model_reuses_in_later_turns_still_run_each_call(agents: list[Agent]) -> None:
    runs: list[str] = []

    @tool
    def note(text: str, ctx: ToolContext) -> str:
        """Remember a note."""
        runs.append(ctx.call_id)
        return f"noted {text}"

    fake = FakeModel([[call("call_0", "note", text="a")], [call("call_0", "note", text="b")], "done"])
    agent(agents, fake, tools=[note]).run_sync("notes")
    assert runs == ["call_0", "call_0#2"]
    assert fake.requests[2].tool_results == {"call_0": "noted b"}


def test_every_message_is_stored_as_it_happens(agents: list[Agent]) -> None:
    holder: list[Agent] = []
    seen_stored: list[list[str]] = []

    def second_round(request: ModelRequest) -> str:
        seen_stored.append([e.message.role for e in holder[0].store.entries("stored-run")])
        return "done"

    fake = FakeModel([[call("c1", "get_lab_result", test_id="LAB-2")], second_round])
    a = agent(agents, fake)
    holder.append(a)
    result = a.run_sync("one lab", run_id="stored-run")
    # When the model was asked the second time, the first turn's call and result were stored.
    assert seen_stored == [["user", "assistant", "tool"]]
    assert a.get_run("stored-run").messages == result.messages
    assert [e.seq for e in a.store.entries("stored-run")] == [0, 1, 2, 3]


def test_an_exhausted_script_fails_the_run_and_retry_continues_it(agents: list[Agent]) -> None:
    fake = FakeModel([[call("c1", "get_lab_result", test_id="LAB-3")]])
    a = agent(agents, fake)
    with pytest.raises(ModelError, match="script has 1 turn"):
        a.run_sync("go", run_id="r-model")
    failed = a.get_run("r-model")
    assert failed.status == "failed" and failed.error is not None and failed.error.code == "model_error"
    fake.script = [*(fake.script or []), "finished"]
    done = a.retry_sync("r-model")
    assert done.status == "completed" and done.output == "finished"
    assert [m.role for m in done.messages] == ["user", "assistant", "tool", "assistant"]


def test_run_ids_are_not_reused_and_unknown_runs_are_reported(agents: list[Agent]) -> None:
    a = agent(agents, FakeModel(["hi"]))
    a.run_sync("x", run_id="once")
    with pytest.raises(ConfigurationError, match="exists"):
        a.run_sync("x", run_id="once")
    with pytest.raises(RunNotFound):
        a.retry_sync("never")
    assert a.retry_sync("once").output == "hi"  # a completed run comes back as it is


def test_model_strings_choose_the_model() -> None:
    assert isinstance(Agent("fake").model, FakeModel)
    model = Agent("openai:gpt-5-mini").model
    assert isinstance(model, OpenAIModel) and model.model == "gpt-5-mini"
    with pytest.raises(ConfigurationError, match="unknown model"):
        Agent("claude")


def test_the_fake_model_without_a_script_echoes_the_prompt(agents: list[Agent]) -> None:
    assert agent(agents, "fake").run_sync("hello there").output == "hello there"


def test_an_agent_is_a_tool_of_another_agent(agents: list[Agent]) -> None:
    inner_fake = FakeModel([
        lambda req: [call("i1", "get_lab_result", test_id=req.messages[0].content)],  # type: ignore[union-attr]
        lambda req: "inner says: " + next(iter(req.tool_results.values())),
    ])
    inner = agent(agents, inner_fake)
    lab_agent = inner.as_tool("lab_agent", "Ask the lab agent about one lab id.")
    assert lab_agent.schema == {"type": "object", "properties": {"prompt": {"type": "string"}},
                                "required": ["prompt"], "additionalProperties": False}
    outer_fake = FakeModel([[call("o1", "lab_agent", prompt="LAB-9")], "outer done"])
    result = agent(agents, outer_fake, tools=[lab_agent]).run_sync("ask", run_id="outer")
    assert result.output == "outer done"
    assert outer_fake.requests[1].tool_results == {
        "o1": 'inner says: {"test_id": "LAB-9", "status": "final"}'
    }
    # The inner run is stored under the outer run and call.
    assert inner.get_run("outer.o1").output == 'inner says: {"test_id": "LAB-9", "status": "final"}'


def test_run_sync_inside_an_event_loop_says_to_await(agents: list[Agent]) -> None:
    a = agent(agents, FakeModel(["x"]))

    async def main() -> None:
        with pytest.raises(RuntimeError, match="await"):
            a.run_sync("x")
        assert (await a.run("x")).output == "x"

    asyncio.run(main())


def test_the_specs_snippet_runs_as_written_against_a_local_server(
    monkeypatch: pytest.MonkeyPatch, agents: list[Agent]
) -> None:
    @tool(read_only=True)
    def flaky_lab(test_id: str) -> dict[str, str]:
        """Raise an unexpected exception."""
        raise RuntimeError("db password=hunter2")

    with chat_server([
        (200, completion(tool_calls=[
            function_call("call_a", "get_lab_result", '{"test_id": "LAB-12345"}'),
            function_call("call_b", "send_message", '{"text": "done"}'),
            function_call("call_c", "flaky_lab", '{"test_id": "LAB-1"}'),
        ])),
        (200, completion("All good.")),
    ]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        from criogenai import Agent, Retry

        agent = Agent(
            "openai:gpt-5-mini",
            tools=[get_lab_result, send, flaky_lab],
            tool_retry=Retry(max_attempts=4, initial_backoff=1.0),
            limits={"tool_timeout_secs": 20},
            on_tool_exception="return_generic",
        )
        agents.append(agent)
        result = agent.run_sync("Check LAB-12345 and tell the team.")
    assert result.output == "All good."
    assert server.paths == ["/v1/chat/completions"] * 2
    assert server.headers[0]["authorization"] == "Bearer sk-test"
    tool_msgs = [m for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs[:2] == [
        {"role": "tool", "tool_call_id": "call_a", "content": '{"test_id": "LAB-12345", "status": "final"}'},
        {"role": "tool", "tool_call_id": "call_b", "content": "sent"},
    ]
    assert "hunter2" not in json.dumps(server.requests)
    assert tool_msgs[2]["content"] == GENERIC_FAILURE
    assert result.tool_results[2].status == "exception"


def test_the_openai_adapter_retries_429_and_5xx_then_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    with chat_server([(429, {"error": {}}), (503, {"error": {}}), (200, completion("fine"))]) as server:
        model = OpenAIModel("m", base_url=server.base_url, initial_backoff=0.01)
        request = ModelRequest(messages=[UserMessage(content="hi")], tools=[])
        reply = asyncio.run(model.complete(request))
    assert reply == AssistantMessage(content="fine")
    assert len(server.requests) == 3
    assert "tools" not in server.requests[0] and "authorization" not in server.headers[0]


def test_the_openai_adapter_gives_up_after_its_attempts_with_a_model_error() -> None:
    with chat_server([(500, {"error": {}})] * 3 + [(400, {"error": {"message": "bad"}})]) as server:
        model = OpenAIModel("m", base_url=server.base_url, max_attempts=2, initial_backoff=0.01)
        request = ModelRequest(messages=[UserMessage(content="hi")], tools=[])
        with pytest.raises(ModelError, match="HTTP 500"):
            asyncio.run(model.complete(request))
        server.replies = [(400, {"error": {"message": "bad"}})]
        with pytest.raises(ModelError, match="HTTP 400"):
            asyncio.run(model.complete(request))
    assert len(server.requests) == 3  # 2 attempts, then a 400 is not retried


def test_openai_needs_a_key_only_for_openai_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    request = ModelRequest(messages=[UserMessage(content="hi")], tools=[])
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        asyncio.run(OpenAIModel("m").complete(request))


def test_tool_messages_hold_only_what_the_model_reads() -> None:
    assert set(ToolMessage.model_fields) == {"v", "role", "call_id", "name", "status", "content"}


def test_a_tool_error_from_an_inner_agent_that_did_not_answer(agents: list[Agent]) -> None:
    inner = agent(agents, FakeModel([[call("x", "get_lab_result", test_id="LAB-1")]] * 5),
                  limits={"max_model_rounds": 1})
    as_tool = inner.as_tool("looper", "Never answers.")
    with pytest.raises(ToolError, match="max_rounds"):
        asyncio.run(as_tool.fn(prompt="x", ctx=ToolContext(call_id="c", run_id="r")))


def test_the_clinic_agent_example_runs_embedded(capsys: pytest.CaptureFixture[str]) -> None:
    from examples import clinic_agent

    assert clinic_agent.main() == 0
    out = capsys.readouterr().out
    assert "(embedded): completed" in out
    assert "lab_2 get_lab_result -> tool_error: Lab ids look like LAB-12345" in out
    assert "visit_bad schedule_visit -> invalid_arguments" in out
    assert "Answer: LAB-12345 is final." in out


def test_before_tool_hooks_are_the_agents_own(agents: list[Agent]) -> None:
    from criogenai import Block, HookCall

    def no_messages_at_night(call: HookCall) -> Block | None:
        return Block("Messages are not sent at night.") if call.tool_name == "send_message" else None

    fake = FakeModel([[call("m", "send_message", text="hi"), call("l", "get_lab_result", test_id="LAB-1")],
                      "ok"])
    result = agent(agents, fake, before_tool=[no_messages_at_night]).run_sync("night shift")
    assert [r.status for r in result.tool_results] == ["blocked", "ok"]
    assert "Messages are not sent at night." in fake.requests[1].tool_results["m"]



def test_a_run_ended_by_any_other_exception_is_stored_failed_with_it_and_retry_continues_it(
    agents: list[Agent],
) -> None:
    class FlakyModel(FakeModel):
        """A model adapter of the user's own, with a bug on its first request."""

        broken = True

        async def complete(self, request: ModelRequest) -> AssistantMessage:
            if self.broken:
                raise RuntimeError("the adapter's bug")
            return await super().complete(request)

    model = FlakyModel(["done"])
    a = agent(agents, model)
    with pytest.raises(RuntimeError, match="adapter's bug"):
        a.run_sync("go", run_id="r-bug")

    failed = a.get_run("r-bug")
    assert failed.status == "failed" and failed.error is not None
    assert (failed.error.code, failed.error.message) == ("error", "RuntimeError: the adapter's bug")
    model.broken = False
    assert a.retry_sync("r-bug").output == "done"
