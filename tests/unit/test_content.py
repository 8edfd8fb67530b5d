"""What a tool's return value becomes for the model, and how one call ends: the worker's execute()."""

import asyncio
import datetime
import json
import threading
import time
from typing import Any

import pytest
from examples.clinic import get_lab_result, schedule_visit
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from criogenai import ToolContext, ToolError, tool
from criogenai.runner._executor import execute
from criogenai.runner._outcomes import GENERIC_FAILURE, Outcome
from criogenai.tools import DEFAULT_MAX_RESULT_CHARS, cut, to_json_text
from criogenai.tools._content import ToolOutput

CTX = ToolContext(call_id="call-1", run_id="run-1", tool_name="t")


class Booking(BaseModel):
    slot: str
    at: datetime.datetime
    tags: set[str] = set()


# -- to_json_text ------------------------------------------------------------------------------


def test_a_string_result_is_sent_as_is() -> None:
    assert to_json_text("booked for 09:00") == "booked for 09:00"
    assert to_json_text('{"not": "parsed"}') == '{"not": "parsed"}'
    assert to_json_text("") == ""


@pytest.mark.parametrize(
    "value",
    [{"booked": "09:00", "minutes": 30}, [1, "two", None, True, 2.5], {"nested": {"list": [{"a": []}]}}],
    ids=["dict", "list", "nested"],
)
def test_dicts_and_lists_are_sent_as_json(value: Any) -> None:
    text = to_json_text(value)

    assert json.loads(text) == value


@pytest.mark.parametrize(("value", "text"), [(3, "3"), (2.5, "2.5"), (True, "true"), (None, "null")])
def test_json_scalars_are_sent_as_json(value: Any, text: str) -> None:
    assert to_json_text(value) == text


def test_non_ascii_text_is_kept_as_is_in_json() -> None:
    assert to_json_text({"city": "Besançon"}) == '{"city": "Besançon"}'


def test_a_pydantic_model_is_converted_to_json() -> None:
    booking = Booking(slot="09:00", at=datetime.datetime(2025, 1, 2, 9, 0), tags={"home"})

    assert json.loads(to_json_text(booking)) == {
        "slot": "09:00",
        "at": "2025-01-02T09:00:00",
        "tags": ["home"],
    }


def test_pydantic_models_inside_containers_are_converted() -> None:
    at = datetime.datetime(2025, 1, 2, 9, 0)

    text = to_json_text({"bookings": [Booking(slot="a", at=at), Booking(slot="b", at=at)]})

    assert [b["slot"] for b in json.loads(text)["bookings"]] == ["a", "b"]


class Opaque:
    pass


@pytest.mark.parametrize(
    "value",
    [{1, 2}, Opaque(), {"when": datetime.date(2025, 1, 1)}, b"bytes", [frozenset()]],
    ids=["set", "object", "date-in-dict", "bytes", "frozenset-in-list"],
)
def test_a_value_that_is_not_json_raises_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match="not a JSON value"):
        to_json_text(value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {"x": [float("-inf")]}], ids=repr)
def test_nan_and_infinity_raise_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match="not valid JSON"):
        to_json_text(value)


def test_a_circular_structure_raises_type_error() -> None:
    loop: list[Any] = []
    loop.append(loop)

    with pytest.raises(TypeError):
        to_json_text(loop)


# -- cut ---------------------------------------------------------------------------------------


def test_the_default_limit_is_100000_characters() -> None:
    assert DEFAULT_MAX_RESULT_CHARS == 100_000
    assert cut("x" * 100_000).truncated is False
    assert cut("x" * 100_001).truncated is True


def test_text_within_the_limit_is_not_cut() -> None:
    body = cut("y" * 100_000)

    assert body.text == "y" * 100_000
    assert body.truncated is False
    assert body.full_chars == 100_000


def test_text_over_the_limit_is_cut_to_exactly_the_limit_with_a_visible_marker() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(150_000))

    body = cut(text)

    assert len(body.text) == 100_000
    assert body.truncated is True
    assert body.full_chars == 150_000
    assert body.text.endswith("[... cut: the result had 150,000 characters, the limit is 100,000]")
    kept = body.text.index("\n[... cut")
    assert body.text[:kept] == text[:kept]
    assert kept > 99_000


@pytest.mark.parametrize("limit", [1, 5, 20, 60])
def test_a_limit_smaller_than_the_marker_still_holds(limit: int) -> None:
    body = cut("z" * 1_000, limit)

    assert len(body.text) <= limit
    assert body.truncated is True


@given(text=st.text(max_size=400), limit=st.integers(min_value=1, max_value=500))
def test_cut_never_exceeds_its_limit_and_only_cuts_what_is_over(text: str, limit: int) -> None:
    body = cut(text, limit)

    assert len(body.text) <= limit
    assert body.full_chars == len(text)
    assert body.truncated is (len(text) > limit)
    if not body.truncated:
        assert body.text == text


# -- execute: one call, start to finish --------------------------------------------------------


def run(t: Any, arguments: object, **options: Any) -> Outcome:
    settings: dict[str, Any] = {
        "timeout_secs": 5.0,
        "on_tool_exception": "return_to_model",
        "max_result_chars": DEFAULT_MAX_RESULT_CHARS,
        **options,
    }
    return execute(t, arguments, CTX, **settings)


def test_a_tool_that_returns_gives_an_ok_outcome_with_its_json() -> None:
    outcome = run(schedule_visit, {"patient_ref": "P-1", "kind": "video", "slots": ["09:00", "10:00"]})

    assert outcome.status == "ok"
    assert json.loads(outcome.content) == {"booked": "09:00", "kind": "video", "minutes": 30}
    assert outcome.truncated is False
    assert outcome.artifact is None
    assert outcome.duration_secs >= 0


def test_a_string_result_is_the_content_as_is() -> None:
    @tool
    def hello(name: str) -> str:
        """Greets."""
        return f"hello {name}"

    assert run(hello, {"name": "Ann"}).content == "hello Ann"


def test_the_tool_receives_the_context_of_the_call() -> None:
    @tool
    def who(ctx: ToolContext) -> dict[str, str]:
        """Reports its context."""
        return {"call_id": ctx.call_id, "run_id": ctx.run_id}

    assert json.loads(run(who, {}).content) == {"call_id": "call-1", "run_id": "run-1"}


def test_an_async_tool_that_returns_gives_an_ok_outcome() -> None:
    @tool
    async def fetch(order_id: str) -> dict[str, str]:
        """Async."""
        await asyncio.sleep(0.01)
        return {"order_id": order_id}

    outcome = run(fetch, {"order_id": "O-1"})

    assert outcome.status == "ok"
    assert json.loads(outcome.content) == {"order_id": "O-1"}


def test_a_pydantic_model_result_is_sent_as_json() -> None:
    @tool
    def make() -> Booking:
        """Returns a model."""
        return Booking(slot="09:00", at=datetime.datetime(2025, 1, 2, 9, 0))

    outcome = run(make, {})

    assert outcome.status == "ok"
    assert json.loads(outcome.content)["at"] == "2025-01-02T09:00:00"


def test_a_result_over_100000_characters_is_cut_with_the_marker() -> None:
    @tool
    def big() -> str:
        """A huge result."""
        return "r" * 150_000

    outcome = run(big, {}, max_result_chars=100_000)

    assert outcome.status == "ok"
    assert len(outcome.content) == 100_000
    assert outcome.truncated is True
    assert "[... cut: the result had 150,000 characters, the limit is 100,000]" in outcome.content
    assert outcome.artifact == {"full_chars": 150_000, "full": "r" * 150_000}  # kept with the run


def test_a_json_result_is_cut_by_the_length_of_its_text() -> None:
    @tool
    def rows() -> list[dict[str, int]]:
        """Many rows."""
        return [{"row": i} for i in range(20_000)]

    outcome = run(rows, {}, max_result_chars=1_000)

    assert len(outcome.content) == 1_000
    assert outcome.truncated is True
    assert outcome.content.startswith('[{"row": 0}, {"row": 1}')


@pytest.mark.parametrize("retryable", [False, True])
def test_tool_error_goes_to_the_model_as_its_message(retryable: bool) -> None:
    @tool
    def refuse(order_id: str) -> None:
        """Refuses."""
        raise ToolError(f"no such order: {order_id}", retryable=retryable)

    outcome = run(refuse, {"order_id": "O-9"})

    assert outcome.status == "tool_error"
    assert outcome.content == "no such order: O-9"
    assert outcome.retryable is retryable


def test_tool_error_from_the_pages_lab_tool() -> None:
    outcome = run(get_lab_result, {"test_id": "12345"})

    assert (outcome.status, outcome.content, outcome.retryable) == (
        "tool_error",
        "Lab ids look like LAB-12345",
        False,
    )


def test_tool_error_from_an_async_tool() -> None:
    @tool
    async def refuse() -> None:
        """Refuses, asynchronously."""
        await asyncio.sleep(0)
        raise ToolError("that slot is taken", retryable=True)

    outcome = run(refuse, {})

    assert (outcome.status, outcome.content, outcome.retryable) == ("tool_error", "that slot is taken", True)


class LedgerUnavailable(Exception):
    pass


SECRET = "patient Jane Roe, NHS 943 476 5919"


@tool
def leaky() -> None:
    """Fails with sensitive text."""
    raise LedgerUnavailable(SECRET)


@tool
async def leaky_async() -> None:
    """Fails with sensitive text, asynchronously."""
    await asyncio.sleep(0)
    raise LedgerUnavailable(SECRET)


@pytest.mark.parametrize("t", [leaky, leaky_async], ids=["sync", "async"])
def test_unexpected_exception_under_return_to_model_shows_type_and_message(t: Any) -> None:
    outcome = run(t, {}, on_tool_exception="return_to_model")

    assert outcome.status == "exception"
    assert outcome.content == f"LedgerUnavailable: {SECRET}"
    assert outcome.retryable is False


@pytest.mark.parametrize("t", [leaky, leaky_async], ids=["sync", "async"])
def test_unexpected_exception_under_return_generic_hides_type_and_message(t: Any) -> None:
    outcome = run(t, {}, on_tool_exception="return_generic")

    assert outcome.status == "exception"
    assert outcome.content == GENERIC_FAILURE
    assert SECRET not in outcome.content
    assert "Jane" not in outcome.content
    assert "LedgerUnavailable" not in outcome.content
    assert outcome.artifact is not None
    # The text is kept in the artifact, stored with the run and never sent to a model.
    assert outcome.artifact["exception"]["type"] == "LedgerUnavailable"
    assert SECRET in outcome.artifact["exception"]["message"]


def test_unexpected_exception_under_fail_keeps_its_details_for_the_run_error() -> None:
    outcome = run(leaky, {}, on_tool_exception="fail")

    assert outcome.status == "exception"
    assert outcome.artifact is not None
    assert outcome.artifact["exception"]["message"] == SECRET
    assert SECRET not in outcome.content


def test_a_result_that_is_not_json_is_an_exception_not_a_crash() -> None:
    @tool
    def tags() -> set[str]:
        """Returns a set."""
        return {"a", "b"}

    outcome = run(tags, {})

    assert outcome.status == "exception"
    assert outcome.content.startswith("TypeError: ")
    assert "set" in outcome.content


def test_a_nan_result_is_an_exception() -> None:
    @tool
    def ratio() -> float:
        """Returns NaN."""
        return float("nan")

    assert run(ratio, {}).status == "exception"


def test_what_a_tool_keeps_for_the_run_is_plain_json_and_a_nan_there_is_an_exception() -> None:
    @tool
    def measured(broken: bool) -> ToolOutput:
        """Returns a value for the model and a reading kept with the run."""
        reading = float("nan") if broken else 1.5
        at = datetime.datetime(2025, 1, 2, 9, 0)
        return ToolOutput("measured", {"reading": reading, "at": Booking(slot="09:00", at=at)})

    kept = run(measured, {"broken": False})
    refused = run(measured, {"broken": True})

    assert kept.status == "ok"
    assert kept.artifact == {"reading": 1.5, "at": {"slot": "09:00", "at": "2025-01-02T09:00:00", "tags": []}}
    assert refused.status == "exception"
    assert "not valid JSON" in refused.content


def test_a_sync_tool_past_its_limit_times_out_without_waiting_for_it() -> None:
    stopped = threading.Event()

    @tool
    def slow() -> str:
        """Sleeps 5 s, in steps the engine can interrupt."""
        try:
            for _ in range(100):
                time.sleep(0.05)
        except BaseException:
            stopped.set()
            raise
        return "finished"

    started = time.monotonic()
    outcome = run(slow, {}, timeout_secs=0.3)
    elapsed = time.monotonic() - started

    assert outcome.status == "timeout"
    assert elapsed < 2.0
    assert 0.3 <= outcome.duration_secs < 2.0
    assert outcome.retryable is True
    assert "'slow'" in outcome.content
    assert "0.3 s" in outcome.content
    assert stopped.wait(2.0), "the tool's thread was not stopped"


def test_an_async_tool_past_its_limit_times_out_and_is_cancelled() -> None:
    cancelled = threading.Event()

    @tool
    async def slow() -> str:
        """Sleeps 5 s."""
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "finished"

    started = time.monotonic()
    outcome = run(slow, {}, timeout_secs=0.3)
    elapsed = time.monotonic() - started

    assert outcome.status == "timeout"
    assert elapsed < 2.0
    assert outcome.retryable is True
    assert cancelled.wait(1.0), "the coroutine was not cancelled"


def test_a_sync_tool_raising_its_own_timeout_error_is_an_exception_not_a_timeout() -> None:
    @tool
    def upstream() -> None:
        """An HTTP client gave up."""
        raise TimeoutError("the lab API did not answer in 2 s")

    outcome = run(upstream, {}, timeout_secs=5.0)

    assert outcome.status == "exception"
    assert outcome.content == "TimeoutError: the lab API did not answer in 2 s"


def test_an_async_tool_raising_its_own_timeout_error_is_an_exception_not_a_timeout() -> None:
    @tool
    async def upstream() -> None:
        """Its own, shorter deadline passed."""
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1)

    started = time.monotonic()
    outcome = run(upstream, {}, timeout_secs=5.0)

    assert outcome.status == "exception"
    assert outcome.content.startswith("TimeoutError")
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("arguments", [{"count": "three"}, {}, {"count": 1, "extra": 2}, None, []], ids=repr)
def test_invalid_arguments_are_refused_and_the_function_is_not_called(arguments: object) -> None:
    calls: list[int] = []

    @tool
    def count(count: int) -> int:
        """Counts."""
        calls.append(count)
        return count

    outcome = run(count, arguments)

    assert outcome.status == "invalid_arguments"
    assert outcome.content.startswith("Invalid arguments for tool 'count':\n- ")
    assert outcome.artifact is not None
    assert outcome.artifact["problems"]
    assert calls == []


def test_valid_arguments_reach_the_function_with_defaults_and_models() -> None:
    seen: list[Any] = []

    class Slot(BaseModel):
        start: str

    @tool
    def take(slot: Slot, minutes: int = 15) -> str:
        """Takes a slot."""
        seen.append((slot, minutes))
        return "ok"

    # Local classes cannot be resolved from a string hint; this module does not postpone annotations.
    outcome = run(take, {"slot": {"start": "09:00"}})

    assert outcome.status == "ok"
    assert seen == [(Slot(start="09:00"), 15)]
