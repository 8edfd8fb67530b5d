"""OpenTelemetry: an agent run is one trace; every call's task span on a real worker descends from its
turn's span, and runs each call in an ``execute_tool`` span in the GenAI semantic conventions.

The dispatcher's spans go to an in-memory exporter in this process; a ``criogenai worker --otel``
subprocess appends its spans as JSON lines to a file (CRIOGENAI_OTEL_SPANS_FILE).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from criogenai import Retry, ToolCall, ToolResult
from criogenai._keys import task_id
from tests.conftest import PYTHONPATH, ROOT, fleet_url, make_dispatcher, wait_for

try:
    import opentelemetry.instrumentation.celery  # noqa: F401  (the worker needs it)
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    HAVE_OTEL = True
except ImportError:
    HAVE_OTEL = False

needs_otel = pytest.mark.skipif(
    not HAVE_OTEL, reason="the otel extra is not installed: pip install -e '.[dev,otel]'"
)
TASK_SPAN = "run/criogenai.call"  # what Celery's instrumentation names the span of a task it runs


@pytest.fixture(scope="module")
def turn_spans() -> Any:
    """Spans finished in this process (the dispatcher's), kept in memory."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # a provider can be set once per process
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


def traced_worker(worker_factory: Any, tmp_path: Path, pool: str, *, by_env: bool = False) -> Path:
    """A worker with tracing on (``--otel``, or ``CRIOGENAI_OTEL=1``); returns the file of its spans."""
    spans_file = tmp_path / f"spans-{uuid.uuid4().hex[:6]}.jsonl"
    env = {"CRIOGENAI_OTEL_SPANS_FILE": str(spans_file), "OTEL_TRACES_EXPORTER": "none"}
    if by_env:
        env["CRIOGENAI_OTEL"] = "1"
    worker_factory(pool=pool, concurrency=2, extra_env=env, extra_args=() if by_env else ("--otel",))
    return spans_file


def the_turn_span(exporter: Any, run_id: str) -> ReadableSpan:
    [span] = [s for s in exporter.get_finished_spans()
              if s.name == "criogenai.turn" and s.attributes.get("criogenai.run_id") == run_id]
    return span


def task_spans(spans_file: Path, run_id: str, expected: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """The worker's spans, waiting (bounded) until each call id has its expected number of task spans."""
    ids = {task_id(run_id, call_id): call_id for call_id in expected}
    deadline = time.monotonic() + 20
    while True:
        lines = spans_file.read_text().splitlines() if spans_file.exists() else []
        spans = [json.loads(line) for line in lines]
        by_call: dict[str, list[dict[str, Any]]] = {c: [] for c in expected}
        for s in spans:
            call_id = ids.get(s["attributes"].get("messaging.message.id"))
            if s["name"] == TASK_SPAN and call_id:
                by_call[call_id].append(s)
        counts = {c: len(v) for c, v in by_call.items()}
        if counts == expected or time.monotonic() > deadline:
            assert counts == expected, f"task spans per call: {counts}; spans: {spans}"
            return {"*": spans, **by_call}
        time.sleep(0.1)


def hex_id(n: int, width: int) -> str:
    return f"0x{n:0{width}x}"


def ancestors(span: dict[str, Any], spans: list[dict[str, Any]]) -> list[str]:
    """The span ids above a span, nearest first, as far as the spans given reach (and one beyond)."""
    by_id = {s["context"]["span_id"]: s for s in spans}
    chain, parent = [], span["parent_id"]
    while parent is not None and parent not in chain:
        chain.append(parent)
        parent = by_id[parent]["parent_id"] if parent in by_id else None
    return chain


@needs_otel
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_every_call_of_a_turn_runs_in_a_task_span_under_the_turn_span(
    pool: str, worker_factory: Any, tmp_path: Path, turn_spans: Any
) -> None:
    # Given a traced worker, and a turn of two calls, one call that is retried once, one invalid call
    spans_file = traced_worker(worker_factory, tmp_path, pool)
    key = uuid.uuid4().hex
    with make_dispatcher(tool_retry=Retry(max_attempts=3, initial_backoff=0.05)) as d:
        results: list[ToolResult] = d.run_turn_sync([
            ToolCall(id="a", name="echo", arguments={"text": "one"}),
            ToolCall(id="b", name="echo", arguments={"text": "two"}),
            ToolCall(id="r", name="flaky_read", arguments={"key": key, "fail_times": 1}),
            ToolCall(id="bad", name="echo", arguments={"text": 5}),
        ])
    assert [(r.status, r.attempts) for r in results] == [("ok", 1), ("ok", 1), ("ok", 2),
                                                         ("invalid_arguments", 0)]
    run_id = results[0].run_id

    # Then the dispatcher made one turn span that names the run, its calls and its tools
    turn = the_turn_span(turn_spans, run_id)
    assert turn.attributes["criogenai.call_count"] == 4
    assert tuple(turn.attributes["criogenai.tools"]) == ("echo", "flaky_read")
    trace_id, turn_id = hex_id(turn.context.trace_id, 32), hex_id(turn.context.span_id, 16)

    # And every call that reached the worker ran in a task span of the turn's trace, under the turn span
    # (the retry's under its first attempt's); the invalid call never reached a worker
    spans = task_spans(spans_file, run_id, {"a": 1, "b": 1, "r": 2, "bad": 0})
    for call_id in ("a", "b", "r"):
        for s in spans[call_id]:
            assert s["context"]["trace_id"] == trace_id, (call_id, s)
            assert turn_id in ancestors(s, spans["*"]), (call_id, s, spans["*"])
    first, again = sorted(spans["r"], key=lambda s: s["start_time"])
    assert [s["parent_id"] for s in (*spans["a"], *spans["b"], first)] == [turn_id] * 3
    assert first["context"]["span_id"] in ancestors(again, spans["*"])


@needs_otel
def test_calls_published_through_kombu_carry_the_turn_trace_too(
    worker_factory: Any, tmp_path: Path, turn_spans: Any
) -> None:
    # Given a worker traced through CRIOGENAI_OTEL=1, and a dispatcher publishing with kombu's producer
    # (as it does on brokers other than Redis), running an async turn
    spans_file = traced_worker(worker_factory, tmp_path, "threads", by_env=True)
    with make_dispatcher() as d:
        d._start()._fast = None  # type: ignore[attr-defined]
        calls = [ToolCall(id=f"k{i}", name="echo", arguments={"text": f"t{i}"}) for i in range(3)]
        results = asyncio.run(d.run_turn(calls))  # type: ignore[attr-defined]
    assert [r.content for r in results] == ["t0", "t1", "t2"]
    turn = the_turn_span(turn_spans, results[0].run_id)

    # Then each call's task span is a child of the turn span
    spans = task_spans(spans_file, results[0].run_id, {"k0": 1, "k1": 1, "k2": 1})
    for call_id in ("k0", "k1", "k2"):
        [s] = spans[call_id]
        assert s["context"]["trace_id"] == hex_id(turn.context.trace_id, 32)
        assert s["parent_id"] == hex_id(turn.context.span_id, 16)


def test_criogenai_runs_without_the_otel_extra(redis_up: None) -> None:
    # Given a process where OpenTelemetry cannot be imported
    hide = "import sys; sys.modules['opentelemetry'] = None\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRIOGENAI_")}
    env["PYTHONPATH"] = PYTHONPATH
    turn = hide + (
        "from criogenai import Dispatcher, ToolCall, _tracing\n"
        "from tests.fleet_tools import echo\n"
        "assert not _tracing.OTEL\n"
        "with Dispatcher([echo]) as d:\n"  # embedded: publishes through kombu (send_call)
        "    [r] = d.run_turn_sync([ToolCall(id='a', name='echo', arguments={'text': 'hi'})])\n"
        "print(r.status, r.content)\n"
    )
    # Then a turn runs as always
    done = subprocess.run([sys.executable, "-c", turn], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok hi", done.stderr

    # And a worker asked to trace refuses to start, naming the extra
    env["CRIOGENAI_BROKER_URL"] = fleet_url()
    worker = hide + (
        "from criogenai._cli import main\n"
        "sys.exit(main(['worker', '--tools', 'tests.fleet_tools', '--otel']))\n"
    )
    done = subprocess.run([sys.executable, "-c", worker], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--otel needs the otel extra: pip install 'criogenai[otel]'" in done.stderr


@needs_otel
@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_an_agent_run_is_one_trace_in_the_genai_conventions(
    pool: str, worker_factory: Any, tmp_path: Path, turn_spans: Any
) -> None:
    # Given a traced worker, and an agent whose model asks for two rounds of tool calls, some failing
    from criogenai import Agent, FakeModel, Settings
    from criogenai.tools import Tool
    from tests import fleet_tools

    spans_file = traced_worker(worker_factory, tmp_path, pool)
    script = [
        [{"id": "ok1", "name": "echo", "arguments": {"text": "a"}},
         {"id": "err", "name": "flaky_write", "arguments": {"key": uuid.uuid4().hex, "fail_times": 5}},
         {"id": "exc", "name": "boom", "arguments": {"secret": "s3cret"}}],
        [{"id": "ok2", "name": "echo", "arguments": {"text": "b"}}],
        "done",
    ]
    tools = [v for v in vars(fleet_tools).values() if isinstance(v, Tool)]
    with Agent(FakeModel(script), tools=tools, settings=Settings(broker_url=fleet_url(), lease_secs=2.0),
               on_tool_exception="return_generic") as agent:
        result = agent.run_sync("go")
    assert result.status == "completed"
    run_id = result.run_id

    # Then the agent process made one invoke_agent span, with a chat span per model call and a turn
    # span per round under it, all in one trace
    [invoke] = [s for s in turn_spans.get_finished_spans()
                if s.name == "invoke_agent" and s.attributes.get("criogenai.run_id") == run_id]
    assert invoke.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert invoke.attributes["gen_ai.provider.name"] == "FakeModel"
    trace_id = invoke.context.trace_id
    mine = [s for s in turn_spans.get_finished_spans() if s.context.trace_id == trace_id]
    chats = [s for s in mine if s.name == "chat"]
    turns = [s for s in mine if s.name == "criogenai.turn"]
    assert len(chats) == 3 and len(turns) == 2 and len(mine) == 6
    assert {s.context.trace_id for s in (*chats, *turns)} == {trace_id}
    assert {s.parent.span_id for s in (*chats, *turns)} == {invoke.context.span_id}
    assert all(s.attributes["gen_ai.operation.name"] == "chat" for s in chats)

    # And on the worker, each call ran in an execute_tool span of the same trace, under its task span,
    # naming the tool, the call and the run; the failed ones have status ERROR and error.type
    tool_spans = execute_tool_spans(spans_file, run_id, 4)
    by_call = {s["attributes"]["gen_ai.tool.call.id"]: s for s in tool_spans}
    assert set(by_call) == {"ok1", "err", "exc", "ok2"}
    for call_id, s in by_call.items():
        assert s["name"] == f"execute_tool {s['attributes']['gen_ai.tool.name']}"
        assert s["context"]["trace_id"] == hex_id(trace_id, 32), call_id
        assert s["attributes"]["gen_ai.operation.name"] == "execute_tool"
        assert s["attributes"]["criogenai.run_id"] == run_id
    assert by_call["err"]["attributes"]["gen_ai.tool.name"] == "flaky_write"
    assert [by_call[c]["status"]["status_code"] for c in ("ok1", "ok2", "err", "exc")] == [
        "UNSET", "UNSET", "ERROR", "ERROR"]
    assert by_call["err"]["attributes"]["error.type"] == "tool_error"
    assert by_call["exc"]["attributes"]["error.type"] == "RuntimeError"
    assert "error.type" not in by_call["ok1"]["attributes"]
    assert "s3cret" not in json.dumps(tool_spans)
    turn_ids = {hex_id(t.context.span_id, 16) for t in turns}
    # A task's span ends (and is written) just after the execute_tool span it holds: wait for them.
    parents = {s["parent_id"] for s in tool_spans}

    def written() -> list[dict[str, Any]]:
        return [json.loads(line) for line in spans_file.read_text().splitlines()]

    wait_for(lambda: parents <= {p["context"]["span_id"] for p in written()}, what="the task spans")
    everything = written()
    for s in tool_spans:
        [parent] = [p for p in everything if p["context"]["span_id"] == s["parent_id"]]
        assert parent["name"] == TASK_SPAN and parent["parent_id"] in turn_ids


def execute_tool_spans(spans_file: Path, run_id: str, count: int) -> list[dict[str, Any]]:
    """The worker's execute_tool spans of a run, waiting (bounded) until there are ``count``."""
    deadline = time.monotonic() + 20
    while True:
        lines = spans_file.read_text().splitlines() if spans_file.exists() else []
        found = [s for s in map(json.loads, lines) if s["name"].startswith("execute_tool")
                 and s["attributes"].get("criogenai.run_id") == run_id]
        if len(found) >= count or time.monotonic() > deadline:
            assert len(found) == count, found
            return found
        time.sleep(0.1)
