"""Fleet operations without a fleet: catalog records, tools rebuilt from them, JSON log lines."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from examples import clinic

from criogenai import CatalogEntry, Tool, ToolContext
from criogenai._logging import JsonFormatter
from criogenai.store import describe_conflict, versions
from criogenai.tools import InvalidArguments, ValidArguments
from criogenai.tools._tool import remote_tool

CLINIC = [v for v in vars(clinic).values() if isinstance(v, Tool)]

SAMPLES: list[Any] = [
    {},
    {"test_id": "LAB-1"},
    {"test_id": 5},
    {"text": "hello"},
    {"patient_ref": "P-1", "kind": "home", "slots": ["2026-12-03T09:00"]},
    {"patient_ref": "P-1", "kind": "spa", "slots": [], "colour": "red"},
    {"patient_ref": "P-1", "kind": "video", "slots": ["x"], "address": {"street": "a", "city": "b"}},
    {"patient_ref": "P-1", "kind": "clinic", "slots": ["x"], "duration_minutes": "long"},
    [1, 2],
]


def _entry(t: Tool[..., Any], worker: str = "w1@host") -> CatalogEntry:
    """A record as it crosses Redis: written as JSON and read back."""
    return CatalogEntry.model_validate_json(CatalogEntry.of(t, worker, 1000.0).model_dump_json())


@pytest.mark.parametrize("original", CLINIC, ids=lambda t: t.name)
def test_a_tool_rebuilt_from_its_catalog_record_judges_calls_as_the_worker_does(
    original: Tool[..., Any],
) -> None:
    rebuilt = remote_tool(_entry(original).definition)
    assert rebuilt.schema_hash == original.schema_hash
    assert (rebuilt.queue, rebuilt.read_only, rebuilt.idempotent, rebuilt.destructive) == (
        original.queue,
        original.read_only,
        original.idempotent,
        original.destructive,
    )
    for arguments in SAMPLES:
        mine, theirs = rebuilt.validate(arguments), original.validate(arguments)
        assert type(mine) is type(theirs), arguments
        if isinstance(theirs, InvalidArguments):
            assert isinstance(mine, InvalidArguments) and mine.problems == theirs.problems
        else:
            assert isinstance(mine, ValidArguments)


def test_a_rebuilt_tool_refuses_to_run_in_the_agent_process() -> None:
    rebuilt = remote_tool(_entry(clinic.get_lab_result).definition)
    with pytest.raises(RuntimeError, match="runs on the workers"):
        rebuilt.invoke({"test_id": "LAB-1"}, ToolContext(call_id="c", run_id="r"))


def test_records_of_one_name_with_different_schemas_are_two_versions_naming_their_workers() -> None:
    from criogenai import tool

    @tool(name="get_lab_result", read_only=True)
    def newer(test_id: str, include_history: bool = False) -> dict[str, str]:
        """Read one lab result by its id, with its history if asked."""
        return {}

    old = [_entry(clinic.get_lab_result, "w1@a"), _entry(clinic.get_lab_result, "w2@b")]
    new = _entry(newer, "w3@c")
    assert len(versions(old)) == 1
    found = versions([*old, new])
    assert sorted(found.values()) == [["w1@a", "w2@b"], ["w3@c"]]
    line = describe_conflict("get_lab_result", [*old, new])
    for text in ("w1@a, w2@b", "w3@c", clinic.get_lab_result.schema_hash, newer.schema_hash):
        assert text in line


def test_a_catalog_record_keeps_the_flat_shape_that_workers_and_dispatchers_of_either_version_read() -> None:
    # Given a record as criogenai wrote it before a tool's definition had a model of its own
    t = clinic.get_lab_result
    before = {
        "v": 1, "name": t.name, "description": t.description, "parameters": t.schema,
        "read_only": t.read_only, "idempotent": t.idempotent, "destructive": t.destructive,
        "timeout_secs": t.timeout_secs, "queue": t.queue, "schema_hash": t.schema_hash,
        "worker": "w1@host", "published_at": 1000.0, "ttl_secs": 90.0,
    }
    # Then it is read as the same definition, and what is written now is that record, key for key
    read = CatalogEntry.model_validate_json(json.dumps(before))
    assert read.definition == t.definition
    assert json.loads(CatalogEntry.of(t, "w1@host", 1000.0).model_dump_json()) == before


def test_a_record_of_another_version_is_refused() -> None:
    raw = json.loads(_entry(clinic.get_lab_result).model_dump_json())
    with pytest.raises(ValueError):
        CatalogEntry.model_validate({**raw, "v": 2})


def test_a_json_log_line_is_one_object_with_the_calls_fields() -> None:
    record = logging.LogRecord("criogenai.calls", logging.INFO, __file__, 1, "call %s", ("finished",), None)
    for name, value in {
        "run_id": "r1",
        "call_id": "c1",
        "tool": "echo",
        "attempt": 2,
        "status": "ok",
        "duration_secs": 0.25,
    }.items():
        setattr(record, name, value)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "call finished" and out["level"] == "INFO"
    assert {k: out[k] for k in ("run_id", "call_id", "tool", "attempt", "status", "duration_secs")} == {
        "run_id": "r1",
        "call_id": "c1",
        "tool": "echo",
        "attempt": 2,
        "status": "ok",
        "duration_secs": 0.25,
    }


def test_a_traceback_stays_inside_its_json_line() -> None:
    try:
        raise ValueError("two\nlines")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert json.loads(line)["exc"].rstrip().endswith("ValueError: two\nlines")


def test_redis_older_than_7_is_refused_by_version_and_newer_servers_pass() -> None:
    from criogenai.store import redis_version_ok

    assert not redis_version_ok("6.2.14")
    assert not redis_version_ok("5.0.7")
    assert redis_version_ok("7.0.0") and redis_version_ok("7.0.15") and redis_version_ok("7.2.4")
    assert redis_version_ok("8.0-rc1") and redis_version_ok("10.1.0")


def test_a_task_returns_json_when_celery_keeps_its_result_and_a_small_report_otherwise() -> None:
    """Celery takes a saferepr of every return value, so the task returns a small report when
    results are ignored (the ledger writes Celery's record); a message may ask Celery to keep
    the result, and then what it stores must be JSON."""
    from celery import Celery

    from criogenai import ToolResult
    from criogenai.runner._outcomes import CallReport
    from criogenai.worker._task import _for_celery

    app = Celery("t", set_as_current=False)

    @app.task(ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def call() -> None: ...

    result = ToolResult(call_id="c", name="echo", run_id="r", status="ok", content="x", attempts=2,
                        duration_secs=0.25, artifact={"hidden": "y"})
    call.push_request()
    report = _for_celery(result, call)
    call.pop_request()
    assert report == CallReport("ok", 2, 0.25)
    call.push_request(ignore_result=False)  # the message overrides the task
    kept = _for_celery(result, call)
    call.pop_request()
    assert isinstance(kept, dict) and json.loads(json.dumps(kept))["content"] == "x"
    assert "artifact" not in kept, "what return_generic hides must not reach Celery's record"
