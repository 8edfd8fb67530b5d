"""Signed calls (criogenai._signing): what is covered, what a worker refuses, and the setting."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from criogenai import ConfigurationError, Settings, ToolCall
from criogenai._signing import SCHEME, canonical, refusal, sign
from criogenai._wire import ToolTask

SECRET = "a-shared-secret-of-some-length"


def make(**changes: Any) -> ToolTask:
    fields: dict[str, Any] = dict(
        run_id="run-1",
        call=ToolCall(id="call-1", name="send_message", arguments={"text": "hi", "to": ["a", "b"]}),
        timeout_secs=20.0,
        max_attempts=1,
        initial_backoff_secs=0.5,
        max_backoff_secs=30.0,
        jitter=0.25,
        on_tool_exception="return_generic",
        max_result_chars=100_000,
        reply_to="crg:reply:abc",
        deadline=time.time() + 300,
    )
    fields.update(changes)
    return ToolTask(**fields)


def test_a_signed_call_passes_after_crossing_the_wire_as_json() -> None:
    signed = sign(make(), SECRET)

    received = ToolTask.model_validate(json.loads(json.dumps(signed.model_dump(mode="json"))))

    assert signed.signature is not None and signed.signature.startswith(SCHEME + ":")
    assert refusal(received, SECRET) is None


def test_the_signature_does_not_depend_on_the_order_of_keys() -> None:
    a = make(call=ToolCall(id="c", name="t", arguments={"x": 1, "y": {"p": 1, "q": 2}}))
    b = make(call=ToolCall(id="c", name="t", arguments={"y": {"q": 2, "p": 1}, "x": 1}),
             deadline=a.deadline)

    assert canonical(a) == canonical(b)


@pytest.mark.parametrize("change", [
    {"call": ToolCall(id="call-1", name="send_message", arguments={"text": "HI", "to": ["a", "b"]})},
    {"call": ToolCall(id="call-1", name="delete_all", arguments={"text": "hi", "to": ["a", "b"]})},
    {"call": ToolCall(id="call-2", name="send_message", arguments={"text": "hi", "to": ["a", "b"]})},
    {"run_id": "run-2"},
    {"deadline": time.time() + 10_000},
    {"timeout_secs": 3600.0},
    {"max_attempts": 5},
    {"on_tool_exception": "return_to_model"},
    {"reply_to": "crg:reply:someone-else"},
    {"max_result_chars": 10},
], ids=["arguments", "tool", "call-id", "run-id", "deadline", "timeout", "attempts", "policy",
        "reply-to", "result-cap"])
def test_changing_anything_signed_is_refused(change: dict[str, Any]) -> None:
    signed = sign(make(), SECRET)

    edited = signed.model_copy(update=change)

    assert refusal(edited, SECRET) == (
        "the call's signature does not match: it was altered, or signed with another secret"
    )


def test_an_unsigned_call_is_refused_by_a_worker_with_a_secret() -> None:
    assert refusal(make(), SECRET) == "the call is not signed, and this worker only runs signed calls"


def test_a_worker_without_a_secret_ignores_signatures() -> None:
    assert refusal(make(), None) is None
    assert refusal(make(signature="made-up"), None) is None


def test_another_secret_or_a_made_up_signature_is_refused() -> None:
    assert refusal(sign(make(), "another-secret-entirely!"), SECRET) is not None
    assert refusal(make(signature="hmac-sha256-v1:" + "0" * 64), SECRET) is not None
    assert refusal(make(signature="ünïcode"), SECRET) is not None


@settings(max_examples=100, deadline=None)
@given(arguments=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
))
def test_any_json_arguments_survive_the_wire_signed(arguments: Any) -> None:
    signed = sign(make(call=ToolCall(id="c", name="t", arguments={"a": arguments})), SECRET)

    received = ToolTask.model_validate_json(signed.model_dump_json())

    assert refusal(received, SECRET) is None


def test_an_unsigned_message_leaves_the_field_out_for_older_workers() -> None:
    assert "signature" not in make().model_dump(mode="json")
    assert "max_stored_chars" not in make().model_dump(mode="json")


def test_the_secret_comes_from_the_environment_and_never_shows() -> None:
    s = Settings.from_env({"CRIOGENAI_SIGNING_SECRET": SECRET})

    assert s.signing_secret == SECRET
    assert SECRET not in repr(s) and SECRET not in str(s)


def test_a_short_secret_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({"CRIOGENAI_SIGNING_SECRET": "hunter2"})

    assert "at least 16 characters" in str(info.value)
    assert "hunter2" not in str(info.value)
