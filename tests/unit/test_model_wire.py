"""Models' wire shapes, checked with the official SDKs' types: Anthropic's Messages API adapter,
tool definitions for both APIs, OpenAI's strict mode, and the test chat server's faithfulness.

Every request an adapter sends to the local server is validated against the SDK's request types,
and every reply the server sends is parsed by the SDK's response models.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from examples.clinic import get_lab_result, schedule_visit, send
from pydantic import ValidationError

from criogenai import Agent, AnthropicModel, ModelError, Settings, tool, tool_from_schema
from criogenai.agent import AssistantMessage, ModelRequest, OpenAIModel, UserMessage
from criogenai.agent._http import retry_after
from criogenai.tools import Tool
from tests import fleet_tools
from tests.chat_server import anthropic_message, chat_server, completion, function_call, tool_use
from tests.sdk_types import (
    check_anthropic_reply,
    check_anthropic_request,
    check_openai_reply,
    check_openai_request,
)

KEY = "sk-ant-secret-0123456789"
CLINIC = [schedule_visit, get_lab_result, send]
FLEET = [v for v in vars(fleet_tools).values() if isinstance(v, Tool)]


@pytest.fixture(autouse=True)
def _embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CRIOGENAI_BROKER_URL", "CRIOGENAI_RESULT_BACKEND", "CRIOGENAI_REDIS_URL",
                 "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    made: list[Agent] = []
    yield made
    for a in made:
        a.close()


def hi() -> ModelRequest:
    return ModelRequest(messages=[UserMessage(content="hi")], tools=[])


def test_the_anthropic_adapter_runs_parallel_tool_use_in_the_messages_wire_format(
    monkeypatch: pytest.MonkeyPatch, agents: list[Agent], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a Messages API server whose model asks for three tools at once, one of which will fail
    calls = [
        tool_use("toolu_a", "get_lab_result", {"test_id": "LAB-12345"}),
        tool_use("toolu_b", "send_message", {"text": "done"}),
        tool_use("toolu_c", "get_lab_result", {"test_id": "nope"}),
    ]
    caplog.set_level(logging.DEBUG)
    replies: list[Any] = [(200, anthropic_message("Looking.", calls)), (200, anthropic_message("All good."))]
    with chat_server(replies) as s:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", s.root_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        agent = Agent("anthropic:claude-test", tools=CLINIC, instructions="Be brief.", settings=Settings())
        agents.append(agent)
        # When the agent runs
        result = agent.run_sync("Check LAB-12345 and tell the team.")

    # Then the run completes, and every request and reply fits the anthropic SDK's types
    assert result.status == "completed" and result.output == "All good."
    for body in s.requests:
        check_anthropic_request(body)
    assert [check_anthropic_reply(r).model for r in s.sent] == ["claude-test"] * 2
    assert s.paths == ["/v1/messages"] * 2
    assert s.headers[0]["x-api-key"] == KEY and s.headers[0]["anthropic-version"] == "2023-06-01"
    first, second = s.requests
    assert first["system"] == "Be brief." and first["model"] == "claude-test" and first["max_tokens"] > 0
    assert first["tools"] == [t.anthropic_definition for t in CLINIC]
    assert first["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Check LAB-12345 and tell the team."}]}]
    # And the model's turn goes back as it said it, then one user message of tool_result blocks in
    # call order, the failed call marked is_error
    assert second["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": "Looking."},
                                                                      *calls]}
    assert second["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_a",
         "content": '{"test_id": "LAB-12345", "status": "final"}', "is_error": False},
        {"type": "tool_result", "tool_use_id": "toolu_b", "content": "sent", "is_error": False},
        {"type": "tool_result", "tool_use_id": "toolu_c", "content": "Lab ids look like LAB-12345",
         "is_error": True},
    ]}
    assert [r.status for r in result.tool_results] == ["ok", "ok", "tool_error"]
    # And the key is in no log line
    assert caplog.records and KEY not in caplog.text


def test_the_anthropic_adapter_retries_429_529_and_5xx_waiting_what_retry_after_asks() -> None:
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    replies: list[Any] = [
        (429, {"type": "error", "error": {"type": "rate_limit_error"}}, {"retry-after": "0"}),
        (529, {"type": "error", "error": {"type": "overloaded_error"}}, {"retry-after-ms": "20"}),
        (500, {"type": "error", "error": {"type": "api_error"}}, {"retry-after": past}),
        (200, anthropic_message("fine")),
    ]
    with chat_server(replies) as s:
        # A backoff of its own would wait 30 s and more: the server's retry-after is what counts
        model = AnthropicModel("m", base_url=s.root_url, initial_backoff=30.0)
        started = time.monotonic()
        reply = asyncio.run(model.complete(hi()))
    assert reply == AssistantMessage(content="fine")
    assert len(s.requests) == 4 and time.monotonic() - started < 15
    assert "x-api-key" not in s.headers[0]  # a server of one's own needs no key


def test_retry_after_is_read_in_milliseconds_seconds_or_as_a_date_and_bounded() -> None:
    soon = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after({"retry-after": "2"}) == 2.0
    assert 3.0 < (retry_after({"retry-after": soon}) or 0) <= 5.0
    assert retry_after({"retry-after": "3600"}) == 60.0  # at most a minute
    assert retry_after({"retry-after": "soon"}) is None and retry_after({}) is None


def test_the_anthropic_adapter_gives_up_with_a_model_error_that_never_holds_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    overloaded = (529, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    refusal = (401, {"type": "error", "error": {"type": "authentication_error"}})
    with chat_server([overloaded, overloaded, refusal]) as s:
        model = AnthropicModel("m", base_url=s.root_url, api_key=KEY, max_attempts=2, initial_backoff=0.01)
        with pytest.raises(ModelError, match="HTTP 529") as overloaded_error:
            asyncio.run(model.complete(hi()))
        with pytest.raises(ModelError, match="HTTP 401") as refused:  # a 4xx other than 429 is not retried
            asyncio.run(model.complete(hi()))
    assert len(s.requests) == 3
    assert KEY not in str(overloaded_error.value) + str(refused.value) + caplog.text + repr(model)


def test_anthropic_needs_a_key_only_for_anthropic_itself() -> None:
    with pytest.raises(ModelError, match="ANTHROPIC_API_KEY"):
        asyncio.run(AnthropicModel("m").complete(hi()))


def test_model_strings_choose_the_anthropic_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Agent("anthropic:claude-sonnet-4-5", settings=Settings()).model
    assert isinstance(model, AnthropicModel) and model.model == "claude-sonnet-4-5"
    assert model.base_url == "https://api.anthropic.com"
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/")
    assert model.base_url == "http://127.0.0.1:9"


def test_a_reply_that_is_not_a_message_is_a_model_error() -> None:
    with chat_server([(200, {"type": "completion", "content": []})]) as s, pytest.raises(
        ModelError, match="not a Messages API reply"
    ):
        asyncio.run(AnthropicModel("m", base_url=s.root_url).complete(hi()))


def test_every_tool_definition_fits_the_sdks_tool_types() -> None:
    tools = [*CLINIC, *FLEET]
    check_anthropic_request({"model": "m", "max_tokens": 1, "messages": [],
                             "tools": [t.anthropic_definition for t in tools]})
    check_openai_request({"model": "m", "messages": [], "tools": [t.openai_definition for t in tools]})
    assert get_lab_result.anthropic_definition == {
        "name": "get_lab_result", "description": "Read one lab result by its id.",
        "input_schema": get_lab_result.schema}


def closed(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False, **extra}


@pytest.mark.parametrize(("parameters", "strict"), [
    (closed({"a": {"type": "string", "pattern": "^x"}, "n": {"type": "integer", "minimum": 0}}), True),
    (closed({"kind": {"enum": ["a", "b"]}, "xs": {"type": "array", "items": {"type": "number"}}}), True),
    (closed({"who": closed({"name": {"type": "string"}})}), True),                        # nested, closed
    (closed({"who": {"$ref": "#/$defs/P"}}, **{"$defs": {"P": closed({"n": {"type": "string"}})}}), True),
    (closed({"note": {"anyOf": [{"type": "string"}, {"type": "null"}]}}), True),         # nullable, required
    (closed({}), True),
    (closed({"a": {"type": "string", "default": "x"}}), False),                          # a default
    ({**closed({"a": {"type": "string"}, "b": {"type": "string"}}), "required": ["a"]}, False),  # optional b
    ({**closed({"a": {"type": "string"}}), "additionalProperties": True}, False),
    (closed({"tags": {"type": "object", "additionalProperties": {"type": "string"}}}), False),  # a dict
    (closed({"who": {"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]}}), False),
    (closed({"a": {"type": "string", "minLength": 1}}), False),                          # unsupported keyword
    (closed({"a": {"allOf": [{"type": "string"}]}}), False),
])
def test_strict_is_offered_only_for_schemas_openai_strict_mode_accepts(
    parameters: dict[str, Any], strict: bool
) -> None:
    t = tool_from_schema(name="t", description="d", parameters=parameters, fn=lambda **kw: None)
    assert t.openai_strict is strict
    assert t.openai_definition["function"].get("strict", False) is strict
    assert OpenAIModel("m", strict=False).body(
        ModelRequest(messages=[], tools=[{"name": "t", "description": "d", "parameters": parameters}])
    )["tools"][0]["function"].keys() == {"name", "description", "parameters"}


def test_which_hinted_tools_are_strict() -> None:
    @tool
    def plain(text: str, n: int, kind: list[str]) -> None:
        """Every parameter required."""

    @tool
    def optional(text: str, n: int = 1) -> None:
        """A parameter with a default."""

    assert plain.openai_strict and get_lab_result.openai_strict and send.openai_strict
    assert not optional.openai_strict and not schedule_visit.openai_strict  # defaults, an open model


def test_the_chat_server_is_faithful_to_the_openai_sdk_and_the_adapter_sends_valid_requests(
    monkeypatch: pytest.MonkeyPatch, agents: list[Agent]
) -> None:
    with chat_server([
        (200, completion(tool_calls=[function_call("call_a", "get_lab_result", '{"test_id": "LAB-12345"}'),
                                     function_call("call_b", "send_message", '{"text": "x"}')])),
        (200, completion("Done.")),
    ]) as s:
        monkeypatch.setenv("OPENAI_BASE_URL", s.base_url)
        agent = Agent("openai:local-model", tools=CLINIC, instructions="Be brief.", settings=Settings())
        agents.append(agent)
        assert agent.run_sync("go").output == "Done."
    parsed = [check_openai_reply(r) for r in s.sent]
    assert [(p.model, p.created > 0) for p in parsed] == [("local-model", True)] * 2
    assert [c.id for c in parsed[0].choices[0].message.tool_calls or []] == ["call_a", "call_b"]
    for body in s.requests:
        check_openai_request(body)
    strict = {t["function"]["name"]: t["function"].get("strict") for t in s.requests[0]["tools"]}
    assert strict == {"schedule_visit": None, "get_lab_result": True, "send_message": True}
    assert json.loads(s.requests[1]["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {
        "test_id": "LAB-12345"}


@pytest.mark.parametrize("field", ["deadline", "timeout_secs", "initial_backoff_secs"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), "NaN", "Infinity"])
def test_a_call_message_with_a_nan_or_infinite_number_is_refused(field: str, value: object) -> None:
    """A deadline of NaN compares false with every time, so a replayed message would never expire;
    an infinite time limit never fires. No wire number may be either."""
    from criogenai._wire import ToolTask

    body = {
        "run_id": "r", "call": {"id": "c", "name": "echo", "arguments": {}}, "timeout_secs": 5,
        "max_attempts": 1, "initial_backoff_secs": 0.1, "max_backoff_secs": 1, "jitter": 0,
        "on_tool_exception": "return_to_model", "max_result_chars": 100, "deadline": 2e9,
    }
    ToolTask.model_validate(body)  # as sent by a dispatcher
    with pytest.raises(ValidationError):
        ToolTask.model_validate({**body, field: value})
