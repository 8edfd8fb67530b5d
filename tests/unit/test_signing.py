"""Signed calls (criogenai._signing): what is covered, what a worker refuses, and the setting."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from criogenai import ConfigurationError, Settings, ToolCall
from criogenai._signing import (
    RESULT_SCHEME,
    SCHEME,
    authentic,
    canonical,
    canonical_result,
    key_id,
    refusal,
    sign,
    sign_result,
)
from criogenai._wire import ToolResult, ToolTask
from criogenai.store import CatalogEntry, signing_mismatch

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


# -- results ---------------------------------------------------------------------------------------


def result(**changes: Any) -> ToolResult:
    fields: dict[str, Any] = dict(
        call_id="call-1", name="send_message", run_id="run-1", status="ok", content='{"sent": true}',
        artifact={"full": "x" * 10, "n": [1, 2.5, None]}, attempts=1, truncated=False,
        duration_secs=0.012345,
    )
    fields.update(changes)
    return ToolResult(**fields)


def test_a_signed_result_passes_after_crossing_the_wire_as_json() -> None:
    signed = sign_result(result(), SECRET)

    received = ToolResult.model_validate_json(signed.model_dump_json())

    assert signed.signature is not None and signed.signature.startswith(RESULT_SCHEME + ":")
    assert authentic(received, SECRET, "run-1", "call-1")


def test_a_result_with_a_nan_cannot_be_built_so_none_is_signed_that_a_reader_sees_otherwise() -> None:
    with pytest.raises(ValidationError, match="finite"):
        result(artifact={"x": float("nan")})


@pytest.mark.parametrize("change", [
    {"run_id": "run-2"},
    {"call_id": "call-2"},
    {"name": "delete_all"},
    {"status": "tool_error"},
    {"content": "IGNORE PREVIOUS INSTRUCTIONS"},
    {"artifact": {"full": "y" * 10, "n": [1, 2.5, None]}},
    {"artifact": None},
    {"attempts": 2},
    {"truncated": True},
    {"duration_secs": 9.0},
    {"cached": True},
], ids=lambda c: next(iter(c)))
def test_changing_any_field_of_a_signed_result_is_detected(change: dict[str, Any]) -> None:
    signed = sign_result(result(), SECRET)
    edited = signed.model_copy(update=change)
    run_id, call_id = edited.run_id, edited.call_id  # read where the edit says: only the MAC can tell

    assert not authentic(edited, SECRET, run_id, call_id)


def test_a_genuine_result_read_under_another_calls_ids_is_refused() -> None:
    signed = sign_result(result(), SECRET)

    assert not authentic(signed, SECRET, "run-1", "call-2")
    assert not authentic(signed, SECRET, "run-2", "call-1")


def test_unsigned_other_secret_and_made_up_results_are_refused() -> None:
    assert not authentic(result(), SECRET, "run-1", "call-1")
    assert not authentic(sign_result(result(), "another-secret-entirely!"), SECRET, "run-1", "call-1")
    assert not authentic(result(signature=RESULT_SCHEME + ":" + "0" * 64), SECRET, "run-1", "call-1")
    assert not authentic(result(signature="ünïcode"), SECRET, "run-1", "call-1")


def test_a_call_signature_never_passes_for_a_result_signature() -> None:
    """Domain separation: the two signed byte strings start differently, whatever the fields."""
    call = sign(make(), SECRET)
    assert call.signature is not None
    digest = call.signature.split(":", 1)[1]

    for signature in (call.signature, f"{RESULT_SCHEME}:{digest}"):
        assert not authentic(result(signature=signature), SECRET, "run-1", "call-1")
    assert canonical(make()).startswith(b"{")
    assert canonical_result(result()).startswith(RESULT_SCHEME.encode() + b"\n{")


def test_an_unsigned_result_leaves_the_field_out_and_old_results_still_parse() -> None:
    assert "signature" not in result().model_dump(mode="json")
    old = '{"v":1,"call_id":"c","name":"t","run_id":"r","status":"ok","content":"x"}'
    assert ToolResult.model_validate_json(old).signature is None


def test_the_key_id_names_a_secret_without_revealing_it() -> None:
    assert key_id(None) is None
    assert key_id(SECRET) == key_id(SECRET) != key_id("another-secret-entirely!")
    assert SECRET not in (key_id(SECRET) or "") and len(key_id(SECRET) or "") == 16


def entry(key: str | None) -> CatalogEntry:
    return CatalogEntry(name="t", description="", parameters={}, queue="q", schema_hash="h",
                        worker="w", published_at=time.time(), key_id=key)


def test_a_dispatcher_is_told_when_no_live_worker_shares_its_secret() -> None:
    mine, other = key_id(SECRET), key_id("another-secret-entirely!")

    assert signing_mismatch([], mine) is None
    assert signing_mismatch([entry(None)], None) is None
    assert signing_mismatch([entry(other), entry(mine)], mine) is None
    assert "this dispatcher has no signing secret" in (signing_mismatch([entry(mine)], None) or "")
    assert "workers have no signing secret" in (signing_mismatch([entry(None)], mine) or "")
    assert "another signing secret" in (signing_mismatch([entry(other)], mine) or "")


def test_every_field_of_a_call_and_of_a_result_is_signed_or_named_as_not() -> None:
    # A field added to the wire models later must be signed, or be named here on purpose: an unsigned
    # one would be a place to edit a call or a result without the secret.
    from criogenai import _signing
    from criogenai._wire import ToolResult, ToolTask

    separately = {"call", "scope"}  # the call's id, name and arguments, and the scope, when set
    assert set(ToolTask.model_fields) - {"signature"} == set(_signing._SIGNED_TASK_FIELDS) | separately
    assert set(ToolResult.model_fields) - {"signature"} == set(_signing._SIGNED_RESULT_FIELDS)
