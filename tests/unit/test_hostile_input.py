"""What a hostile model (or a tool fed hostile text) sends is data: refused clearly, or carried safely.

Call ids that would forge log lines or drive an operator's terminal, validators that raise what
pydantic does not catch, texts holding lone surrogates that no UTF-8 record can carry, names of any
size in a trace span, and the agent's renaming of a repeated longest id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError, field_validator

from criogenai import Agent, Dispatcher, FakeModel, ToolCall, ToolError, tool
from criogenai._wire import PendingApproval, ToolResult
from criogenai.dispatcher._validate import coerce_calls
from criogenai.tools import InvalidArguments
from criogenai.tools._content import to_json_text
from tests.hostile_tools import Item


@tool
def takes_item(item: Item) -> str:
    """Take an item."""
    return item.name


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


@tool
def surrogate_text() -> str:
    """A string a bad decode left a lone surrogate in."""
    return "abc\ud800"


@tool
def surrogate_key() -> dict[str, int]:
    """An object whose key holds a lone surrogate."""
    return {"\udcff": 1}


@tool
def refuses_with_surrogate() -> str:
    """A ToolError whose message holds a lone surrogate."""
    raise ToolError("no such page: \ud800")


@tool
def raises_with_surrogate() -> str:
    """An exception whose message holds a lone surrogate."""
    raise ValueError("bad \udc80 byte")


def run_one(d: Dispatcher, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
    (result,) = d.run_turn_sync([ToolCall(id="c1", name=name, arguments=arguments or {})])
    return result


# -- validators ---------------------------------------------------------------------------------


def test_a_validator_raising_what_pydantic_does_not_catch_is_invalid_arguments_without_its_text() -> None:
    checked = takes_item.validate({"item": {"name": "boom"}})

    assert isinstance(checked, InvalidArguments)
    assert checked.problems == ["arguments: a validator of this tool raised RuntimeError"]
    with Dispatcher([takes_item], on_tool_exception="return_generic") as d:
        result = run_one(d, "takes_item", {"item": {"name": "boom"}})  # the turn goes on: nothing raised
    assert result.status == "invalid_arguments"
    assert "SECRET" not in result.model_dump_json()


class Page(BaseModel):
    url: str

    @field_validator("url")
    @classmethod
    def _decodable(cls, value: str) -> str:
        raise ToolError("cannot parse: " + b"\xff".decode("utf-8", "surrogateescape"))


@tool
def takes_page(page: Page) -> str:
    """Read a page."""
    return page.url


def test_a_validators_message_holding_a_lone_surrogate_is_invalid_arguments_that_can_be_filed() -> None:
    with Dispatcher([takes_page]) as d:
        result = run_one(d, "takes_page", {"page": {"url": "x"}})

    assert result.status == "invalid_arguments"
    assert "cannot parse: \\udcff" in result.content
    json.loads(result.model_dump_json())  # the result can be filed and sent


# -- lone surrogates ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc\ud800", {"k": ["\udcff"]}, {"\udcff": 1}])
def test_text_holding_a_lone_surrogate_is_not_json(value: object) -> None:
    with pytest.raises(TypeError, match="lone surrogate"):
        to_json_text(value)


@pytest.mark.parametrize("name", ["surrogate_text", "surrogate_key"])
def test_a_result_holding_a_lone_surrogate_is_the_calls_exception(name: str) -> None:
    with Dispatcher([surrogate_text, surrogate_key]) as d:
        result = run_one(d, name)

    assert result.status == "exception"
    assert "lone surrogate" in result.content
    assert result.attempts == 1
    json.loads(result.model_dump_json())  # the result can be filed and sent


def test_a_tool_error_holding_a_lone_surrogate_reaches_the_model_escaped() -> None:
    with Dispatcher([refuses_with_surrogate]) as d:
        result = run_one(d, "refuses_with_surrogate")

    assert result.status == "tool_error"
    assert result.content == "no such page: \\ud800"
    json.loads(result.model_dump_json())


@pytest.mark.parametrize("policy", ["return_to_model", "return_generic"])
def test_an_exception_text_holding_a_lone_surrogate_is_kept_escaped(policy: Any) -> None:
    with Dispatcher([raises_with_surrogate], on_tool_exception=policy) as d:
        result = run_one(d, "raises_with_surrogate")

    assert result.status == "exception"
    stored = json.loads(result.model_dump_json())  # the artifact can be filed with the run
    assert stored["artifact"]["exception"]["message"] == "bad \\udc80 byte"
    assert "\\udc80" in stored["artifact"]["exception"]["traceback"]


# -- call ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize("call_id", ["c1\nINFO forged line", "c1\x1b[2K\rapproved", "c1\r", "c1\u2028",
                                     "c1\u202e", "c1\x00", "c1\x85"])
def test_a_call_id_with_a_control_or_format_character_is_refused_by_name(call_id: str) -> None:
    with pytest.raises(ValidationError, match="a call id must be printable text"):
        ToolCall(id=call_id, name="echo")
    with pytest.raises(ValueError, match="not a tool call"):
        coerce_calls([{"id": call_id, "name": "echo", "arguments": {}}])


@pytest.mark.parametrize("call_id", ["call_0a9Z", "toolu_01A", "{x}", "*", "a:b:c", "é ü 中", "a b"])
def test_printable_call_ids_of_any_script_or_punctuation_are_accepted(call_id: str) -> None:
    with Dispatcher([echo]) as d:
        (result,) = d.run_turn_sync([ToolCall(id=call_id, name="echo", arguments={"text": "hi"})])
    assert (result.call_id, result.status) == (call_id, "ok")


def test_an_agent_runs_two_calls_sharing_the_longest_id() -> None:
    longest = "c" * 256
    fake = FakeModel([[{"id": longest, "name": "echo", "arguments": {"text": "a"}},
                       {"id": longest, "name": "echo", "arguments": {"text": "b"}}], "done"])
    with Agent(fake, tools=[echo]) as agent:
        run = agent.run_sync("go")

    assert run.output == "done"
    contents = [m.content for m in fake.requests[-1].messages if getattr(m, "role", "") == "tool"]
    assert contents == ["a", "b"]


# -- what an operator reads -----------------------------------------------------------------------


def test_approvals_list_shows_stored_control_characters_escaped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from criogenai import _cli_approvals

    call = ToolCall.model_construct(id="c1\x1b[2K\rfake", name="send\nrun2  c9",
                                    arguments={"to": "\x1b]0;x\x07"})
    record = PendingApproval.model_construct(run_id="r\x1b[31m", call=call, parameters={}, requested_at=0.0,
                                             decision="approved", by="eve\x1b[0m")

    class Store:
        def records(self, run: str | None, decided: bool) -> list[PendingApproval]:
            return [record]

    monkeypatch.setattr(_cli_approvals, "_approvals", Store)
    _cli_approvals._list(argparse.Namespace(run=None, all=True, json=False))

    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert out.count("\n") == 1  # one record, one line
    assert "c1\\x1b[2K\\rfake" in out and "send\\nrun2  c9" in out and "by eve\\x1b[0m" in out


def test_mcp_serve_logs_a_clients_tool_name_on_one_line_and_cut(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("mcp")
    import mcp_types

    from criogenai._mcp_serve import FleetServer

    class Registry:
        def __contains__(self, name: object) -> bool:
            return True

    class OneResult:
        async def run_turn(self, calls: list[ToolCall], run_id: str) -> list[ToolResult]:
            return [ToolResult(call_id=calls[0].id, name=calls[0].name, run_id=run_id, status="tool_error",
                               content="no")]

    server = FleetServer(dispatcher=OneResult(), registry=Registry())  # type: ignore[arg-type]
    name = "x\nERROR forged line" + "y" * 10_000
    params = mcp_types.CallToolRequestParams(name=name, arguments={})
    with caplog.at_level(logging.INFO, logger="criogenai"):
        asyncio.run(server._call_tool(None, params))  # type: ignore[arg-type]

    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mcp serve:")]
    assert "\n" not in line and len(line) < 200


def test_a_turn_span_names_only_the_registrys_tools() -> None:
    from criogenai import _tracing

    class Span:
        attributes: dict[str, Any] = {}

        def set_attributes(self, attributes: dict[str, Any]) -> None:
            self.attributes = attributes

        def get_span_context(self) -> Any:
            return argparse.Namespace(is_valid=False)

    span = Span()
    token = _tracing._turn.set([span])
    try:
        calls = [ToolCall(id="a", name="echo"), ToolCall(id="b", name="x" * 1_000_000)]
        _tracing.note_turn("r1", calls, {"echo"})
    finally:
        _tracing._turn.reset(token)
    assert span.attributes["criogenai.tools"] == ["echo"]
    assert span.attributes["criogenai.call_count"] == 2


# -- what a model's reply may hold ----------------------------------------------------------------


def test_a_model_writing_a_lone_surrogate_gets_its_call_run_with_the_replacement_character() -> None:
    from tests.chat_server import chat_server, completion, function_call

    with chat_server([
        (200, completion("note \udc80", tool_calls=[function_call("c1", "echo", '{"text": "a\\ud800"}')])),
        (200, completion("done")),
    ]) as server:
        from criogenai import OpenAIModel

        with Agent(OpenAIModel("m", base_url=server.base_url, api_key="sk-test"), tools=[echo]) as agent:
            run = agent.run_sync("go")  # the next request could not be encoded before

    assert run.output == "done"
    second = server.requests[1]["messages"]
    assert second[-2]["content"] == "note \ufffd" and second[-1]["content"] == "a\ufffd"


def test_a_call_id_a_model_made_unprintable_or_too_long_is_replaced_and_the_run_goes_on() -> None:
    from tests.chat_server import chat_server, completion, function_call

    odd = "call_1\u2028x"
    with chat_server([
        (200, completion(None, tool_calls=[function_call(odd, "echo", '{"text": "a"}'),
                                           function_call("x" * 300, "echo", '{"text": "b"}')])),
        (200, completion("done")),
    ]) as server:
        from criogenai import OpenAIModel

        with Agent(OpenAIModel("m", base_url=server.base_url, api_key="sk-test"), tools=[echo]) as agent:
            run = agent.run_sync("go")

    assert run.output == "done"
    second = server.requests[1]["messages"]
    ids = [c["id"] for c in second[-3]["tool_calls"]]
    assert all(i.isprintable() and len(i) <= 256 for i in ids) and len(set(ids)) == 2
    assert [m["tool_call_id"] for m in second[-2:]] == ids  # the model reads each result under its id


def test_arguments_nested_past_what_python_parses_are_kept_as_text_not_a_crash() -> None:
    import httpx

    from criogenai.agent import _openai

    deep = "[" * 100_000 + "]" * 100_000
    body = {"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": deep}}]}}]}
    reply = _openai.parse_reply(httpx.Response(200, json=body))

    assert reply.tool_calls[0].arguments == deep  # kept as text: the model is told it is not an object


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_reply_nested_past_what_python_parses_is_a_model_error(api: str) -> None:
    import httpx

    from criogenai import ModelError
    from criogenai.agent import _anthropic, _openai

    deep = "[" * 100_000 + "]" * 100_000
    raw = (f'{{"type":"message","content":[{{"type":"tool_use","id":"c1","name":"echo","input":{deep}}}]}}'
           if api == "anthropic" else
           f'{{"choices":[{{"message":{{"tool_calls":[{{"id":"c1","function":{{"arguments":{deep}}}}}]}}}}]}}')
    parse = _anthropic.parse_reply if api == "anthropic" else _openai.parse_reply
    with pytest.raises(ModelError, match="not a"):
        parse(httpx.Response(200, content=raw.encode()))


# -- one user's results are never another's ------------------------------------------------------


def test_a_result_cache_never_answers_one_users_memory_search_with_anothers() -> None:
    from criogenai import Memory, ResultCache

    memory, cache = Memory(namespace="clinic"), ResultCache(ttl_secs=600)

    def agent(script: list[Any]) -> Agent:
        return Agent(FakeModel(script), memory=memory, before_tool=[cache.before], after_tool=[cache.after])

    def recall(user: str) -> str:
        ask = [{"id": "c1", "name": "search_memory", "arguments": {"query": "mornings"}}]
        with agent([ask, lambda request: request.messages[-1].content]) as a:
            return str(a.run_sync("what?", user=user).output)

    with agent([[{"id": "c1", "name": "remember", "arguments": {"text": "Prefers mornings"}}], "ok"]) as a:
        a.run_sync("note it", user="alice")

    assert "Prefers mornings" in recall("alice")  # now in the cache, for alice
    assert json.loads(recall("bob")) == []
    assert "Prefers mornings" in recall("alice")


def test_a_result_cache_still_answers_the_same_scope_and_calls_without_one() -> None:
    from criogenai import ResultCache

    runs: list[str] = []

    @tool(read_only=True)
    def lookup(term: str) -> str:
        """Look a term up."""
        runs.append(term)
        return term.upper()

    cache = ResultCache(ttl_secs=600)
    with Dispatcher([lookup], before_tool=[cache.before], after_tool=[cache.after]) as d:
        for scope in (None, None, "alice", "alice", "bob"):
            (r,) = d.run_turn_sync([ToolCall(id="c1", name="lookup", arguments={"term": "x"})], scope=scope)
            assert r.content == "X"
    assert len(runs) == 3  # once without a scope, once for alice, once for bob


def test_mcp_serve_sends_a_result_nested_past_what_python_parses_as_text() -> None:
    pytest.importorskip("mcp")
    from criogenai._mcp_serve import as_mcp_result

    text = '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"
    out = as_mcp_result(ToolResult(call_id="c1", name="n", status="ok", content=text))

    assert out.structured_content is None and out.content[0].text == text and not out.is_error


# -- run ids ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_id", ["a}:claim:c1", "{a}", "r\nINFO forged", "r\x1b[2J", "r" * 201, ""])
def test_a_run_id_that_could_shape_another_runs_keys_or_forge_log_lines_is_refused(run_id: str) -> None:
    from criogenai import ConfigurationError

    with Dispatcher([echo]) as d, pytest.raises(ConfigurationError, match="run id"):
        d.run_turn_sync([ToolCall(id="c1", name="echo", arguments={"text": "x"})], run_id=run_id)
    with Agent(FakeModel(["hi"]), tools=[echo]) as agent, pytest.raises(ConfigurationError, match="run id"):
        agent.run_sync("go", run_id=run_id)


@pytest.mark.parametrize("run_id", ["run-1", "9f1c2d", "tenant:alice:42", "r" * 200])
def test_run_ids_of_printable_characters_without_braces_are_used_as_given(run_id: str) -> None:
    with Dispatcher([echo]) as d:
        (result,) = d.run_turn_sync([ToolCall(id="c1", name="echo", arguments={"text": "x"})], run_id=run_id)
    assert (result.run_id, result.status) == (run_id, "ok")
